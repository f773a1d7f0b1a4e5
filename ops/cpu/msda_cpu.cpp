// Fused multi-scale deformable attention for CPU (forward and backward), OpenMP through
// at::parallel_for. Semantics are those of grid_sample(bilinear, zeros, align_corners=False):
// x = loc_x * W - 0.5, corners outside the map contribute zero.
//
// Layouts (all contiguous):
//   value    (B, K, NH, D)        a pixel of one head is one row of D values
//   loc      (B, Q, NH, L, P, 2)  x, y in [0, 1]
//   attn     (B, Q, NH, L, P)
//   out      (B, Q, NH, D)
// Design (each choice can be switched off by a variant bit, so its worth can be measured):
//   * nothing sampled is materialised: per output row (b, q, h) the corners of all its
//     levels x points are planned (offsets, weights, software prefetch of the rows and,
//     kStreamAhead rows ahead, of the per-row inputs: kNoPrefetch turns both off) one row
//     ahead of their use, then weighted and accumulated in a register accumulator
//     (forward) or scattered at once (backward); the fractions and weights of a row's
//     samples are computed together in one branch-free loop the compiler vectorises;
//   * kFused: the four corners of a sample are read in ONE pass over D (out-of-map corners
//     read a zero row / write a sink row); without it, one pass per corner;
//   * work is ordered query by query, all heads of a query in turn (their rows of a pixel
//     are one contiguous block); kHeadMajor orders it head by head instead;
//   * the backward's per-sample dot products reduce in registers as a tree of vector
//     halves, not as a serial chain of scalar adds;
//   * backward grad_value without contention: kPrivate gives each thread a contiguous
//     range of work; it writes grad_value directly except in the one batch entry it may
//     share with the previous thread, which goes to a private copy added at the end;
//     kOwner partitions work by (batch, head) so each grad_value slice has one writer;
//     kAtomic parallelises over queries and adds atomically. With none of them set the
//     kernel takes kPrivate while the copies stay small, else kOwner.
//   * all offsets are int64.
#include <ATen/Parallel.h>
#include <torch/extension.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

namespace {

constexpr int64_t kFused = 1;
constexpr int64_t kAtomic = 2;
constexpr int64_t kPrivate = 4;
constexpr int64_t kOwner = 8;
constexpr int64_t kNoPrefetch = 16;
constexpr int64_t kHeadMajor = 32;

// kPrivate is taken automatically while the extra grad_value copies stay under this.
constexpr int64_t kPrivateBudgetBytes = int64_t(1) << 28;

struct Dims {
  int64_t B, K, NH, D, L, Q, P;
  int64_t rows() const { return B * Q * NH; }  // output rows (b, q, h)
};

// Per-sample constants of a row, the same for every row: sample i of a row lies on level
// i / P, of W x H pixels whose first pixel row starts `level` elements after (b, h)'s.
template <typename T>
struct SampleTable {
  SampleTable(const int64_t* shapes, const int64_t* starts, const Dims& d)
      : Hf(d.L * d.P), Wf(d.L * d.P), H(d.L * d.P), W(d.L * d.P), level(d.L * d.P) {
    for (int64_t i = 0; i < d.L * d.P; ++i) {
      const int64_t l = i / d.P;
      Hf[i] = static_cast<T>(shapes[2 * l]);
      Wf[i] = static_cast<T>(shapes[2 * l + 1]);
      H[i] = shapes[2 * l];
      W[i] = shapes[2 * l + 1];
      level[i] = starts[l] * d.NH * d.D;
    }
  }
  std::vector<T> Hf, Wf;
  std::vector<int64_t> H, W, level;
};

// The planned samples of one output row (b, q, h): absolute element offsets of the four
// corner rows (shared by value and grad_value; -1 = outside the map), bilinear weights
// (w[k * n + i] for corner k of sample i; all zero when the sample misses the map) and
// fractions.
template <typename T>
struct RowPlan {
  explicit RowPlan(int64_t n) : off(4 * n), w(4 * n), fx(n), fy(n), x0(n), y0(n), in(n) {}
  std::vector<int64_t> off;
  std::vector<T> w, fx, fy;
  std::vector<int32_t> x0, y0, in;
};

template <int WRITE, typename T>
inline void prefetch_row(const T* row, int64_t D) {
  for (int64_t byte = 0; byte < D * static_cast<int64_t>(sizeof(T)); byte += 64) {
    __builtin_prefetch(reinterpret_cast<const char*>(row) + byte, WRITE, 3);
  }
}

// The per-row input streams (sampling locations, attention weights, the output gradient)
// are prefetched this many rows ahead of their use: the corner-row prefetches keep the miss
// buffers busy and the hardware prefetcher alone left these sequential loads missing (a
// profile put the hottest instruction of the planning on the location load).
constexpr int64_t kStreamAhead = 4;

// Prefetches row `row + kStreamAhead` of a (rows, count) stream, if it exists.
template <typename T>
inline void prefetch_ahead(const T* base, int64_t row, int64_t rows, int64_t count) {
  if (row + kStreamAhead < rows) prefetch_row<0>(base + (row + kStreamAhead) * count, count);
}

// Fractions, weights, top-left corners and in-map flags of a row's n samples (x, y
// interleaved in xy), branch-free so that the compiler vectorises it.
template <typename T>
inline void plan_samples(const T* __restrict xy, const T* __restrict Hf, const T* __restrict Wf,
                         int64_t n, T* __restrict w, T* __restrict fx, T* __restrict fy,
                         int32_t* __restrict x0, int32_t* __restrict y0,
                         int32_t* __restrict in) {
  for (int64_t i = 0; i < n; ++i) {
    const T xr = xy[2 * i] * Wf[i] - T(0.5);
    const T yr = xy[2 * i + 1] * Hf[i] - T(0.5);
    const bool inside = (yr >= T(-1)) & (xr >= T(-1)) & (yr < Hf[i]) & (xr < Wf[i]);
    const T x = inside ? xr : T(0), y = inside ? yr : T(0);
    const T xf = std::floor(x), yf = std::floor(y);
    const T ax = x - xf, ay = y - yf;
    const T m = inside ? T(1) : T(0);
    const T bx = m - m * ax, by = T(1) - ay;
    fx[i] = ax;
    fy[i] = ay;
    w[i] = by * bx;
    w[n + i] = by * (m * ax);
    w[2 * n + i] = ay * bx;
    w[3 * n + i] = ay * (m * ax);
    x0[i] = static_cast<int32_t>(xf);
    y0[i] = static_cast<int32_t>(yf);
    in[i] = inside;
  }
}

// Plans row (b, q, h) and, when `prefetch`, prefetches its corner rows of value and (in
// the backward, gvalue != nullptr) of the grad_value rows written at gvalue + off - gshift.
// Semantics of grid_sample(bilinear, zeros, align_corners=False): x = loc_x * W - 0.5; a
// sample with no corner inside the map (also NaN/inf, which fail every comparison) gets
// zero weights and no corners. x = -1 is kept: its right corner has weight 0 but a
// gradient, exactly as in grid_sample.
template <typename T>
void plan_row(const T* value, const SampleTable<T>& tab, const T* loc, int64_t b, int64_t bq,
              int64_t h, const Dims& d, int64_t D, bool prefetch, RowPlan<T>& plan,
              const T* gvalue = nullptr, int64_t gshift = 0) {
  const int64_t n = d.L * d.P;
  const int64_t row = bq * d.NH + h;
  if (prefetch) prefetch_ahead(loc, row, d.rows(), 2 * n);
  plan_samples(loc + 2 * row * n, tab.Hf.data(), tab.Wf.data(), n, plan.w.data(), plan.fx.data(),
               plan.fy.data(), plan.x0.data(), plan.y0.data(), plan.in.data());
  const int32_t* x0 = plan.x0.data();
  const int32_t* y0 = plan.y0.data();
  const int32_t* in = plan.in.data();
  const int64_t row_stride = d.NH * D;
  const int64_t first = (b * d.K * d.NH + h) * D;
  for (int64_t i = 0; i < n; ++i) {
    int64_t* off = &plan.off[4 * i];
    const int64_t W = tab.W[i];
    const int64_t H = tab.H[i];
    const int64_t px = x0[i], py = y0[i];
    const int64_t o = first + tab.level[i] + (py * W + px) * row_stride;
    const bool xa = px >= 0, xb = px + 1 < W, ya = in[i] && py >= 0, yb = in[i] && py + 1 < H;
    off[0] = (ya && xa) ? o : -1;
    off[1] = (ya && xb) ? o + row_stride : -1;
    off[2] = (yb && xa) ? o + W * row_stride : -1;
    off[3] = (yb && xb) ? o + (W + 1) * row_stride : -1;
    if (!prefetch) continue;
    for (int k = 0; k < 4; ++k) {
      if (off[k] < 0) continue;
      prefetch_row<0>(value + off[k], D);
      if (gvalue != nullptr) prefetch_row<1>(gvalue + (off[k] - gshift), D);
    }
  }
}

// The output row (b, q, h) = sum over levels x points of attn * bilinear(value), from the
// row's plan.
template <typename T, int DC, bool FUSED>
inline void forward_row(const T* value, const T* attn, T* out, int64_t bq, int64_t h,
                        const Dims& d, const RowPlan<T>& plan, const T* zeros, T* acc,
                        bool prefetch) {
  const int64_t D = DC > 0 ? DC : d.D;
  const int64_t n = d.L * d.P;
  const T* a_row = attn + (bq * d.NH + h) * n;
  if (prefetch) prefetch_ahead(attn, bq * d.NH + h, d.rows(), n);
  for (int64_t c = 0; c < D; ++c) acc[c] = T(0);
  for (int64_t i = 0; i < n; ++i) {
    if (!plan.in[i]) continue;
    const int64_t* off = &plan.off[4 * i];
    const T a = a_row[i];
    const T w[4] = {plan.w[i], plan.w[n + i], plan.w[2 * n + i], plan.w[3 * n + i]};
    if (FUSED) {
      const T* v0 = off[0] >= 0 ? value + off[0] : zeros;
      const T* v1 = off[1] >= 0 ? value + off[1] : zeros;
      const T* v2 = off[2] >= 0 ? value + off[2] : zeros;
      const T* v3 = off[3] >= 0 ? value + off[3] : zeros;
      const T w0 = a * w[0], w1 = a * w[1], w2 = a * w[2], w3 = a * w[3];
#pragma omp simd
      for (int64_t c = 0; c < D; ++c) {
        acc[c] += w0 * v0[c] + w1 * v1[c] + w2 * v2[c] + w3 * v3[c];
      }
    } else {
      for (int k = 0; k < 4; ++k) {
        if (off[k] < 0) continue;
        const T wk = a * w[k];
        const T* v = value + off[k];
#pragma omp simd
        for (int64_t c = 0; c < D; ++c) acc[c] += wk * v[c];
      }
    }
  }
  T* o = out + (bq * d.NH + h) * D;
  for (int64_t c = 0; c < D; ++c) o[c] = acc[c];
}

// Work order. Query-major (default): items are (b, q), all heads of a query in turn; the
// heads of a query sample around the same reference point, and the rows of one pixel for
// all heads are one contiguous NH*D block. Head-major (kHeadMajor): items are (b, h,
// block of kQueryBlock queries), one head's queries in order. fn(b, bq, h) is called per
// row; [begin, end) ranges over items.
constexpr int64_t kQueryBlock = 64;

inline int64_t num_blocks(const Dims& d) { return (d.Q + kQueryBlock - 1) / kQueryBlock; }

inline int64_t num_items(const Dims& d, bool head_major) {
  return head_major ? d.B * d.NH * num_blocks(d) : d.B * d.Q;
}

inline int64_t item_batch(const Dims& d, bool head_major, int64_t item) {
  return head_major ? item / (d.NH * num_blocks(d)) : item / d.Q;
}

template <typename F>
inline void for_rows(const Dims& d, bool head_major, int64_t begin, int64_t end, F&& fn) {
  if (!head_major) {
    for (int64_t bq = begin; bq < end; ++bq) {
      for (int64_t h = 0; h < d.NH; ++h) fn(bq / d.Q, bq, h);
    }
    return;
  }
  const int64_t blocks = num_blocks(d);
  for (int64_t item = begin; item < end; ++item) {
    const int64_t b = item / (d.NH * blocks);
    const int64_t h = (item / blocks) % d.NH;
    const int64_t q0 = (item % blocks) * kQueryBlock;
    const int64_t q1 = std::min(d.Q, q0 + kQueryBlock);
    for (int64_t q = q0; q < q1; ++q) fn(b, b * d.Q + q, h);
  }
}

// The rows of items [begin, end) in order, software-pipelined: each row is planned (its
// corner rows prefetched) one row before it is computed, so the prefetches have a whole
// row's work to arrive. plan(b, bq, h, RowPlan&), compute(b, bq, h, const RowPlan&).
template <typename T, typename Plan, typename Compute>
inline void pipelined_rows(const Dims& d, bool head_major, int64_t begin, int64_t end,
                           RowPlan<T>* plans, Plan&& plan, Compute&& compute) {
  int64_t pb = 0, pbq = 0, ph = 0;
  bool pending = false;
  int buf = 0;
  for_rows(d, head_major, begin, end, [&](int64_t b, int64_t bq, int64_t h) {
    plan(b, bq, h, plans[buf]);
    if (pending) compute(pb, pbq, ph, plans[buf ^ 1]);
    pb = b, pbq = bq, ph = h, pending = true;
    buf ^= 1;
  });
  if (pending) compute(pb, pbq, ph, plans[buf ^ 1]);
}

template <typename T, int DC, bool FUSED>
void forward_impl(const T* value, const int64_t* shapes, const int64_t* starts, const T* loc,
                  const T* attn, T* out, const Dims& d, bool prefetch, bool head_major) {
  const int64_t D = DC > 0 ? DC : d.D;
  const int64_t n = d.L * d.P;
  const SampleTable<T> tab(shapes, starts, d);
  const int64_t grain = head_major ? 1 : std::max<int64_t>(1, 256 / (d.NH * n));
  at::parallel_for(0, num_items(d, head_major), grain, [&](int64_t begin, int64_t end) {
    RowPlan<T> plans[2] = {RowPlan<T>(n), RowPlan<T>(n)};
    std::vector<T> zeros(D, T(0));
    std::vector<T> acc_dyn(DC > 0 ? 0 : D);
    alignas(64) T acc_fix[DC > 0 ? DC : 1];
    T* acc = DC > 0 ? acc_fix : acc_dyn.data();
    pipelined_rows<T>(
        d, head_major, begin, end, plans,
        [&](int64_t b, int64_t bq, int64_t h, RowPlan<T>& plan) {
          plan_row(value, tab, loc, b, bq, h, d, D, prefetch, plan);
        },
        [&](int64_t, int64_t bq, int64_t h, const RowPlan<T>& plan) {
          forward_row<T, DC, FUSED>(value, attn, out, bq, h, d, plan, zeros.data(), acc,
                                    prefetch);
        });
  });
}

// Native-width vectors (GCC/Clang vector extensions: 64 bytes with AVX-512, 32 with AVX,
// else 16, lowered to AVX-512, AVX2, SSE or NEON) for the backward's per-sample dot
// products, whose horizontal sums reduce in registers as a tree. Wider than native, the
// four corner accumulators no longer fit the register file: 64-byte vectors on an
// AVX2-only CPU made the ddetr-enc backward about 2x slower than 32-byte ones.
#if defined(__AVX512F__)
constexpr int kVecBytes = 64;
#elif defined(__AVX__)
constexpr int kVecBytes = 32;
#else
constexpr int kVecBytes = 16;
#endif
template <typename T, int BYTES>
struct VecOf {
  typedef T type __attribute__((vector_size(BYTES)));
};
template <typename T, int BYTES = kVecBytes>
using Vec = typename VecOf<T, BYTES>::type;

template <typename T, int BYTES = kVecBytes>
inline Vec<T, BYTES> load(const T* p) {
  Vec<T, BYTES> v;
  std::memcpy(&v, p, BYTES);
  return v;
}

template <typename T, int BYTES = kVecBytes>
inline void store(T* p, Vec<T, BYTES> v) {
  std::memcpy(p, &v, BYTES);
}

template <typename T, int BYTES = kVecBytes>
inline T hsum(Vec<T, BYTES> v) {
  if constexpr (BYTES == 2 * sizeof(T)) {
    return v[0] + v[1];
  } else {
    Vec<T, BYTES / 2> lo, hi;
    std::memcpy(&lo, &v, BYTES / 2);
    std::memcpy(&hi, reinterpret_cast<const char*>(&v) + BYTES / 2, BYTES / 2);
    return hsum<T, BYTES / 2>(lo + hi);
  }
}

template <typename T>
constexpr int64_t kLanes = kVecBytes / static_cast<int64_t>(sizeof(T));

// dot(g, v_k) for the four corners and gv_k += w_k * g, in one pass over D.
template <typename T, int DC>
inline void fused_corner_grads(const T* g, const T* const* v, T* const* gv, const T* wk,
                               int64_t Dd, T* dots) {
  const int64_t D = DC > 0 ? DC : Dd;
  constexpr int64_t VL = kLanes<T>;
  Vec<T> p[4] = {};
  int64_t c = 0;
  for (; c + VL <= D; c += VL) {
    const Vec<T> gc = load<T>(g + c);
    for (int k = 0; k < 4; ++k) {
      p[k] += gc * load<T>(v[k] + c);
      store<T>(gv[k] + c, load<T>(gv[k] + c) + wk[k] * gc);
    }
  }
  T tail[4] = {0, 0, 0, 0};
  for (; c < D; ++c) {
    for (int k = 0; k < 4; ++k) {
      tail[k] += g[c] * v[k][c];
      gv[k][c] += wk[k] * g[c];
    }
  }
  for (int k = 0; k < 4; ++k) dots[k] = hsum<T>(p[k]) + tail[k];
}

template <typename T, int DC>
inline T dot_row(const T* g, const T* v, int64_t Dd) {
  const int64_t D = DC > 0 ? DC : Dd;
  constexpr int64_t VL = kLanes<T>;
  Vec<T> p = {};
  int64_t c = 0;
  for (; c + VL <= D; c += VL) p += load<T>(g + c) * load<T>(v + c);
  T tail = 0;
  for (; c < D; ++c) tail += g[c] * v[c];
  return hsum<T>(p) + tail;
}

template <typename T, int DC, bool ATOMIC>
inline void add_row(T* dst, const T* g, T w, int64_t Dd) {
  const int64_t D = DC > 0 ? DC : Dd;
  if (ATOMIC) {
    for (int64_t c = 0; c < D; ++c) {
#pragma omp atomic
      dst[c] += w * g[c];
    }
  } else {
#pragma omp simd
    for (int64_t c = 0; c < D; ++c) dst[c] += w * g[c];
  }
}

// Per-thread buffers of the backward.
template <typename T>
struct BackwardScratch {
  BackwardScratch(int64_t n, int64_t D)
      : plans{RowPlan<T>(n), RowPlan<T>(n)}, zeros(D, T(0)), sink(D, T(0)) {}
  RowPlan<T> plans[2];
  std::vector<T> zeros, sink;
};

// Gradients of one output row (b, q, h) over all its levels and points, from the row's
// plan. grad_value rows are written at gvalue + (offset - gshift).
template <typename T, int DC, bool FUSED, bool ATOMIC>
inline void backward_row(const T* value, const SampleTable<T>& tab, const T* attn, const T* gout,
                         T* gvalue, int64_t gshift, T* gloc, T* gattn, int64_t bq, int64_t h,
                         const Dims& d, const RowPlan<T>& plan, BackwardScratch<T>& scratch,
                         bool prefetch) {
  const int64_t D = DC > 0 ? DC : d.D;
  const int64_t n = d.L * d.P;
  const int64_t row = bq * d.NH + h;
  const T* g = gout + row * D;
  if (prefetch) {
    prefetch_ahead(gout, row, d.rows(), D);
    prefetch_ahead(attn, row, d.rows(), n);
  }
  const T* a_row = attn + row * n;
  T* ga_row = gattn + row * n;
  T* gl_row = gloc + 2 * row * n;
  for (int64_t i = 0; i < n; ++i) {
    if (!plan.in[i]) {
      ga_row[i] = T(0);
      gl_row[2 * i] = T(0);
      gl_row[2 * i + 1] = T(0);
      continue;
    }
    const int64_t* off = &plan.off[4 * i];
    const T w[4] = {plan.w[i], plan.w[n + i], plan.w[2 * n + i], plan.w[3 * n + i]};
    const T a = a_row[i];
    T dots[4] = {0, 0, 0, 0};
    if (FUSED && !ATOMIC) {
      const T* v[4];
      T* gv[4];
      T wa[4];
      for (int k = 0; k < 4; ++k) {
        v[k] = off[k] >= 0 ? value + off[k] : scratch.zeros.data();
        gv[k] = off[k] >= 0 ? gvalue + (off[k] - gshift) : scratch.sink.data();
        wa[k] = a * w[k];
      }
      fused_corner_grads<T, DC>(g, v, gv, wa, D, dots);
    } else {
      for (int k = 0; k < 4; ++k) {
        if (off[k] < 0) continue;
        dots[k] = dot_row<T, DC>(g, value + off[k], D);
        add_row<T, DC, ATOMIC>(gvalue + (off[k] - gshift), g, a * w[k], D);
      }
    }
    const T H = tab.Hf[i], W = tab.Wf[i];
    const T fx = plan.fx[i], fy = plan.fy[i];
    ga_row[i] = w[0] * dots[0] + w[1] * dots[1] + w[2] * dots[2] + w[3] * dots[3];
    const T gx = (T(1) - fy) * (dots[1] - dots[0]) + fy * (dots[3] - dots[2]);
    const T gy = (T(1) - fx) * (dots[2] - dots[0]) + fx * (dots[3] - dots[1]);
    gl_row[2 * i] = a * gx * W;
    gl_row[2 * i + 1] = a * gy * H;
  }
}

// dst[i] += src[i] for i < numel, in parallel.
template <typename T>
void add_into(T* dst, const T* src, int64_t numel) {
  at::parallel_for(0, numel, 4096, [&](int64_t begin, int64_t end) {
#pragma omp simd
    for (int64_t i = begin; i < end; ++i) dst[i] += src[i];
  });
}

template <typename T, int DC, bool FUSED>
void backward_impl(const T* value, const int64_t* shapes, const int64_t* starts, const T* loc,
                   const T* attn, const T* gout, T* gvalue, T* gloc, T* gattn, const Dims& d,
                   int64_t variant) {
  const int64_t D = DC > 0 ? DC : d.D;
  const int64_t n = d.L * d.P;
  const SampleTable<T> tab(shapes, starts, d);
  const bool prefetch = !(variant & kNoPrefetch);
  const bool head_major = variant & kHeadMajor;
  const int64_t slice = d.K * d.NH * D;  // grad_value elements of one batch entry
  const int64_t items = num_items(d, head_major);
  const int64_t threads = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), items));
  auto plan_into = [&](const T* target, int64_t shift) {
    return [&, target, shift](int64_t b, int64_t bq, int64_t h, RowPlan<T>& p) {
      plan_row(value, tab, loc, b, bq, h, d, D, prefetch, p, target, shift);
    };
  };
  // Private strategy: thread t takes the t-th contiguous range of items and writes
  // grad_value directly, except in the batch entry its range shares with the previous
  // thread's (at most its first one), which it accumulates in a private copy of that
  // entry; the copies are added at the end.
  auto range = [&](int64_t t) { return std::make_pair(items * t / threads, items * (t + 1) / threads); };
  auto shares_first_batch = [&](int64_t t) {
    const auto [r0, r1] = range(t);
    return r0 > 0 && r0 < r1 && item_batch(d, head_major, r0 - 1) == item_batch(d, head_major, r0);
  };
  int64_t strategy = variant & (kAtomic | kPrivate | kOwner);
  if (strategy == 0) {
    int64_t copies = 0;
    for (int64_t t = 1; t < threads; ++t) copies += shares_first_batch(t);
    const int64_t extra = copies * slice * static_cast<int64_t>(sizeof(T));
    strategy = extra <= kPrivateBudgetBytes ? kPrivate : kOwner;
  }
  if (strategy & kAtomic) {
    const int64_t grain = std::max<int64_t>(1, 256 / (d.NH * n));
    at::parallel_for(0, d.B * d.Q, grain, [&](int64_t begin, int64_t end) {
      BackwardScratch<T> scratch(n, D);
      pipelined_rows<T>(d, false, begin, end, scratch.plans, plan_into(gvalue, 0),
                        [&](int64_t, int64_t bq, int64_t h, const RowPlan<T>& p) {
                          backward_row<T, DC, FUSED, true>(value, tab, attn, gout, gvalue, 0,
                                                           gloc, gattn, bq, h, d, p, scratch,
                                                           prefetch);
                        });
    });
    return;
  }
  if (strategy & kPrivate) {
    std::vector<std::vector<T>> copies(threads);
    at::parallel_for(0, threads, 1, [&](int64_t begin, int64_t end) {
      BackwardScratch<T> scratch(n, D);
      for (int64_t t = begin; t < end; ++t) {
        const auto [r0, r1] = range(t);
        if (r0 >= r1) continue;
        const int64_t shared_b = shares_first_batch(t) ? item_batch(d, head_major, r0) : -1;
        if (shared_b >= 0) copies[t].assign(static_cast<size_t>(slice), T(0));
        T* copy = copies[t].data();
        auto plan = [&](int64_t b, int64_t bq, int64_t h, RowPlan<T>& p) {
          const bool own = b != shared_b;
          plan_row(value, tab, loc, b, bq, h, d, D, prefetch, p, own ? gvalue : copy,
                   own ? 0 : b * slice);
        };
        pipelined_rows<T>(d, head_major, r0, r1, scratch.plans, plan,
                          [&](int64_t b, int64_t bq, int64_t h, const RowPlan<T>& p) {
                            const bool own = b != shared_b;
                            backward_row<T, DC, FUSED, false>(
                                value, tab, attn, gout, own ? gvalue : copy,
                                own ? 0 : b * slice, gloc, gattn, bq, h, d, p, scratch,
                                prefetch);
                          });
      }
    });
    for (int64_t t = 1; t < threads; ++t) {
      if (copies[t].empty()) continue;
      add_into(gvalue + item_batch(d, head_major, range(t).first) * slice, copies[t].data(),
               slice);
    }
    return;
  }
  // Ownership: item = (chunk, b, h). With fewer (b, h) pairs than threads the queries are
  // split into chunks; chunk 0 writes grad_value, the others private copies.
  const int64_t pairs = d.B * d.NH;
  const int64_t chunks = std::min<int64_t>({(threads + pairs - 1) / pairs, d.Q, 8});
  const int64_t numel = d.B * slice;
  std::vector<T> copies(static_cast<size_t>((chunks - 1) * numel), T(0));
  at::parallel_for(0, chunks * pairs, 1, [&](int64_t begin, int64_t end) {
    BackwardScratch<T> scratch(n, D);
    for (int64_t item = begin; item < end; ++item) {
      const int64_t chunk = item / pairs;
      const int64_t b = (item % pairs) / d.NH;
      const int64_t h = item % d.NH;
      T* target = chunk == 0 ? gvalue : copies.data() + (chunk - 1) * numel;
      const int64_t q0 = d.Q * chunk / chunks, q1 = d.Q * (chunk + 1) / chunks;
      for (int64_t q = q0; q < q1; ++q) {
        plan_row(value, tab, loc, b, b * d.Q + q, h, d, D, prefetch, scratch.plans[0],
                 target);
        backward_row<T, DC, FUSED, false>(value, tab, attn, gout, target, 0, gloc, gattn,
                                          b * d.Q + q, h, d, scratch.plans[0], scratch,
                                          prefetch);
      }
    }
  });
  for (int64_t k = 1; k < chunks; ++k) add_into(gvalue, copies.data() + (k - 1) * numel, numel);
}

struct Prepared {
  at::Tensor value, shapes, starts, loc, attn;
  Dims d;
};

Prepared prepare(const at::Tensor& value, const at::Tensor& spatial_shapes,
                 const at::Tensor& level_start_index, const at::Tensor& sampling_locations,
                 const at::Tensor& attention_weights) {
  TORCH_CHECK(value.device().is_cpu(), "value: expected a CPU tensor");
  TORCH_CHECK(value.dim() == 4, "value: expected (bs, num_keys, num_heads, head_dim)");
  TORCH_CHECK(sampling_locations.dim() == 6,
              "sampling_locations: expected (bs, num_queries, num_heads, num_levels, num_points, 2)");
  Prepared r;
  r.value = value.contiguous();
  r.shapes = spatial_shapes.to(at::kLong).contiguous();
  r.starts = level_start_index.to(at::kLong).contiguous();
  r.loc = sampling_locations.to(value.scalar_type()).contiguous();
  r.attn = attention_weights.to(value.scalar_type()).contiguous();
  r.d = Dims{value.size(0), value.size(1), value.size(2), value.size(3),
             spatial_shapes.size(0), sampling_locations.size(1), sampling_locations.size(4)};
  const Dims& d = r.d;
  TORCH_CHECK(r.shapes.dim() == 2 && r.shapes.size(1) == 2,
              "spatial_shapes: expected (num_levels, 2)");
  TORCH_CHECK(r.starts.numel() == d.L, "level_start_index: expected (num_levels,)");
  TORCH_CHECK(sampling_locations.size(0) == d.B && sampling_locations.size(2) == d.NH &&
                  sampling_locations.size(3) == d.L && sampling_locations.size(5) == 2,
              "sampling_locations: expected (bs, num_queries, num_heads, num_levels, num_points, 2)");
  TORCH_CHECK(attention_weights.sizes() == sampling_locations.sizes().slice(0, 5),
              "attention_weights: expected (bs, num_queries, num_heads, num_levels, num_points)");
  const int64_t* sh = r.shapes.data_ptr<int64_t>();
  const int64_t* st = r.starts.data_ptr<int64_t>();
  int64_t total = 0;
  for (int64_t l = 0; l < d.L; ++l) {
    TORCH_CHECK(sh[2 * l] > 0 && sh[2 * l + 1] > 0, "spatial_shapes: expected positive (H, W)");
    TORCH_CHECK(sh[2 * l] < (int64_t(1) << 31) && sh[2 * l + 1] < (int64_t(1) << 31),
                "spatial_shapes: expected H and W below 2**31 (corners are int32 pixel indices)");
    TORCH_CHECK(st[l] == total, "level_start_index: expected cumulative H*W of spatial_shapes");
    total += sh[2 * l] * sh[2 * l + 1];
  }
  TORCH_CHECK(total == d.K, "spatial_shapes: sum of H*W must equal value.shape[1]");
  return r;
}

// Compile-time head_dim for the common sizes, a runtime loop otherwise.
#define NPUDET_DISPATCH_D(D, DC, ...)                 \
  switch (D) {                                        \
    case 16: { constexpr int DC = 16; __VA_ARGS__(); break; } \
    case 32: { constexpr int DC = 32; __VA_ARGS__(); break; } \
    case 64: { constexpr int DC = 64; __VA_ARGS__(); break; } \
    default: { constexpr int DC = 0; __VA_ARGS__(); break; }  \
  }

at::Tensor msda_forward(const at::Tensor& value, const at::Tensor& spatial_shapes,
                        const at::Tensor& level_start_index, const at::Tensor& sampling_locations,
                        const at::Tensor& attention_weights, int64_t variant) {
  Prepared r = prepare(value, spatial_shapes, level_start_index, sampling_locations,
                       attention_weights);
  const Dims& d = r.d;
  at::Tensor out = at::empty({d.B, d.Q, d.NH * d.D}, r.value.options());
  const bool fused = variant & kFused;
  const bool prefetch = !(variant & kNoPrefetch);
  const bool head_major = variant & kHeadMajor;
  AT_DISPATCH_FLOATING_TYPES(r.value.scalar_type(), "msda_cpu_forward", [&] {
    const auto* v = r.value.data_ptr<scalar_t>();
    const auto* sh = r.shapes.data_ptr<int64_t>();
    const auto* st = r.starts.data_ptr<int64_t>();
    const auto* lc = r.loc.data_ptr<scalar_t>();
    const auto* aw = r.attn.data_ptr<scalar_t>();
    auto* o = out.data_ptr<scalar_t>();
    NPUDET_DISPATCH_D(d.D, DC, [&] {
      if (fused) forward_impl<scalar_t, DC, true>(v, sh, st, lc, aw, o, d, prefetch, head_major);
      else forward_impl<scalar_t, DC, false>(v, sh, st, lc, aw, o, d, prefetch, head_major);
    });
  });
  return out;
}

std::vector<at::Tensor> msda_backward(const at::Tensor& grad_output, const at::Tensor& value,
                                      const at::Tensor& spatial_shapes,
                                      const at::Tensor& level_start_index,
                                      const at::Tensor& sampling_locations,
                                      const at::Tensor& attention_weights, int64_t variant) {
  Prepared r = prepare(value, spatial_shapes, level_start_index, sampling_locations,
                       attention_weights);
  const Dims& d = r.d;
  TORCH_CHECK(grad_output.numel() == d.B * d.Q * d.NH * d.D,
              "grad_output: expected (bs, num_queries, num_heads * head_dim)");
  at::Tensor g = grad_output.to(r.value.scalar_type()).contiguous();
  at::Tensor gvalue = at::zeros_like(r.value);
  at::Tensor gloc = at::empty_like(r.loc);
  at::Tensor gattn = at::empty_like(r.attn);
  const bool fused = variant & kFused;
  AT_DISPATCH_FLOATING_TYPES(r.value.scalar_type(), "msda_cpu_backward", [&] {
    const auto* v = r.value.data_ptr<scalar_t>();
    const auto* sh = r.shapes.data_ptr<int64_t>();
    const auto* st = r.starts.data_ptr<int64_t>();
    const auto* lc = r.loc.data_ptr<scalar_t>();
    const auto* aw = r.attn.data_ptr<scalar_t>();
    const auto* go = g.data_ptr<scalar_t>();
    auto* gv = gvalue.data_ptr<scalar_t>();
    auto* gl = gloc.data_ptr<scalar_t>();
    auto* ga = gattn.data_ptr<scalar_t>();
    NPUDET_DISPATCH_D(d.D, DC, [&] {
      if (fused) backward_impl<scalar_t, DC, true>(v, sh, st, lc, aw, go, gv, gl, ga, d, variant);
      else backward_impl<scalar_t, DC, false>(v, sh, st, lc, aw, go, gv, gl, ga, d, variant);
    });
  });
  return {gvalue, gloc, gattn};
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("forward", &msda_forward, "MSDA forward (CPU)");
  m.def("backward", &msda_backward, "MSDA backward (CPU): grad value, locations, weights");
}
