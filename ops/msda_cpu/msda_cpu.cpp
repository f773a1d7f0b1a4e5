// Fused multi-scale deformable attention for CPU (forward and backward), OpenMP through
// at::parallel_for. Semantics are those of grid_sample(bilinear, zeros, align_corners=False):
// x = loc_x * W - 0.5, corners outside the map contribute zero.
//
// Layouts (all contiguous):
//   value    (B, K, NH, D)        a pixel of one head is one row of D values
//   loc      (B, Q, NH, L, P, 2)  x, y in [0, 1]
//   attn     (B, Q, NH, L, P)
//   out      (B, Q, NH, D)
// Design. Each choice is a field of KernelOptions (Python: cpu_options.CPUKernelOptions) and
// a compile-time template parameter, so the hot loops carry no branch on it and an
// ablation variant changes exactly one:
//   * nothing sampled is materialised: per output row (b, q, h) the corners of all its
//     levels x points are planned (offsets, weights) one row ahead of their use, then
//     weighted and accumulated in a register accumulator (forward) or scattered at once
//     (backward); the fractions and weights of a row's samples are computed together in
//     one branch-free loop the compiler vectorises;
//   * PREFETCH (prefetch): the planned corner rows, and kStreamAhead rows ahead the per-row
//     inputs, are software-prefetched;
//   * FUSED (fused): the four corners of a sample are read in ONE pass over D
//     (out-of-map corners read a zero row / write a sink row); without it, one pass per
//     corner;
//   * HEAD_MAJOR (head_major): work is ordered query by query, all heads of a query in turn
//     (their rows of a pixel are one contiguous block), or head by head, a block of
//     kQueryBlock queries per work item;
//   * the backward's per-sample dot products reduce in registers as a tree of vector
//     halves, not as a serial chain of scalar adds;
//   * backward grad_value (backward):
//       kAuto  - private copies while their extra memory stays within private_budget_bytes,
//                else ownership: each thread takes a contiguous range of work and writes
//                grad_value directly, except in the one batch entry it may share with the
//                previous thread, which goes to a private copy (one batch slice, K*NH*D)
//                added at the end: at most threads - 1 slices;
//       kOwner - work partitioned by (batch, head) so each grad_value slice has one writer;
//                with fewer pairs than threads the queries are split into chunks, every
//                chunk but the first writing a private copy of grad_value (B*K*NH*D),
//                as many chunks as private_budget_bytes allows (one: no copy);
//       kAtomic - parallel over the work items, adding atomically into grad_value.
//   * all offsets are int64.
#include "msda_cpu.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace {

// The kernel's design choices; parsed from the ints of CPUKernelOptions.as_ints().
enum class Backward : int64_t { kAuto = 0, kOwner = 1, kAtomic = 2 };

struct KernelOptions {
  Backward backward = Backward::kAuto;
  bool fused = true;
  bool prefetch = true;
  bool head_major = false;
  int64_t private_budget_bytes = int64_t(1) << 28;
};

constexpr size_t kNumOptions = 5;

KernelOptions parse_options(const std::vector<int64_t>& o) {
  TORCH_CHECK_VALUE(o.size() == kNumOptions, "options: expected ", kNumOptions,
                    " ints [backward, fused, prefetch, head_major, private_budget_bytes], got ",
                    o.size());
  TORCH_CHECK_VALUE(o[0] >= 0 && o[0] <= 2, "options: backward code ", o[0],
                    " unknown; expected 0 (auto), 1 (owner) or 2 (atomic)");
  for (size_t i = 1; i < 4; ++i) {
    TORCH_CHECK_VALUE(o[i] == 0 || o[i] == 1, "options[", i, "]: expected 0 or 1, got ", o[i]);
  }
  TORCH_CHECK_VALUE(o[4] >= 0, "options: private_budget_bytes must be >= 0, got ", o[4]);
  KernelOptions k;
  k.backward = static_cast<Backward>(o[0]);
  k.fused = o[1];
  k.prefetch = o[2];
  k.head_major = o[3];
  k.private_budget_bytes = o[4];
  return k;
}

// Calls f(std::integral_constant<bool, b>{}): a runtime choice becomes a template argument.
template <typename F>
inline void with_bool(bool b, F&& f) {
  if (b) {
    f(std::true_type{});
  } else {
    f(std::false_type{});
  }
}

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

// The pixel coordinate of a normalised location along an axis of `size` pixels, computed
// as grid_sample(align_corners=False) computes it after mmcv's `2 * loc - 1`:
// ((2 loc - 1) + 1) * size / 2 - 0.5, the last step one fused multiply-add where the
// instruction set has one (ATen's AVX2/AVX512 CPU kernels contract it, its DEFAULT kernel
// does not). `loc * size - 0.5` is the same number in exact arithmetic, but mmcv's initial
// offsets put most samples exactly on pixel centres, where the location gradient is
// one-sided and the last bit of this arithmetic picks the side: computed differently, ~1%
// of those gradients took the other side and training parted from grid_sample's.
template <typename T>
inline T unnormalize(T loc, T size) {
  const T grid = T(2) * loc - T(1);
#if defined(__FMA__) || defined(__ARM_FEATURE_FMA)
  return std::fma(grid + T(1), size * T(0.5), T(-0.5));
#else
  return (grid + T(1)) * (size * T(0.5)) - T(0.5);
#endif
}

// Fractions, weights, top-left corners and in-map flags of a row's n samples (x, y
// interleaved in xy), branch-free so that the compiler vectorises it.
template <typename T>
inline void plan_samples(const T* __restrict xy, const T* __restrict Hf, const T* __restrict Wf,
                         int64_t n, T* __restrict w, T* __restrict fx, T* __restrict fy,
                         int32_t* __restrict x0, int32_t* __restrict y0,
                         int32_t* __restrict in) {
  for (int64_t i = 0; i < n; ++i) {
    const T xr = unnormalize(xy[2 * i], Wf[i]);
    const T yr = unnormalize(xy[2 * i + 1], Hf[i]);
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

// Plans row (b, q, h) and, with PREFETCH, prefetches its corner rows of value and (in
// the backward, gvalue != nullptr) of the grad_value rows written at gvalue + off - gshift.
// Semantics of grid_sample(bilinear, zeros, align_corners=False): x = unnormalize(loc_x, W); a
// sample with no corner inside the map (also NaN/inf, which fail every comparison) gets
// zero weights and no corners. x = -1 is kept: its right corner has weight 0 but a
// gradient, exactly as in grid_sample.
template <bool PREFETCH, typename T>
void plan_row(const T* value, const SampleTable<T>& tab, const T* loc, int64_t b, int64_t bq,
              int64_t h, const Dims& d, int64_t D, RowPlan<T>& plan,
              const T* gvalue = nullptr, int64_t gshift = 0) {
  const int64_t n = d.L * d.P;
  const int64_t row = bq * d.NH + h;
  if constexpr (PREFETCH) prefetch_ahead(loc, row, d.rows(), 2 * n);
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
    if constexpr (!PREFETCH) continue;
    for (int k = 0; k < 4; ++k) {
      if (off[k] < 0) continue;
      prefetch_row<0>(value + off[k], D);
      if (gvalue != nullptr) prefetch_row<1>(gvalue + (off[k] - gshift), D);
    }
  }
}

// The output row (b, q, h) = sum over levels x points of attn * bilinear(value), from the
// row's plan.
template <typename T, int DC, bool FUSED, bool PREFETCH>
inline void forward_row(const T* value, const T* attn, T* out, int64_t bq, int64_t h,
                        const Dims& d, const RowPlan<T>& plan, const T* zeros, T* acc) {
  const int64_t D = DC > 0 ? DC : d.D;
  const int64_t n = d.L * d.P;
  const T* a_row = attn + (bq * d.NH + h) * n;
  if constexpr (PREFETCH) prefetch_ahead(attn, bq * d.NH + h, d.rows(), n);
  for (int64_t c = 0; c < D; ++c) acc[c] = T(0);
  // grid_sample's path multiplies a sample off the map (zeros) by its weight too: a NaN or
  // inf weight there makes the whole row NaN. `missed` (a * 0 summed) carries that.
  T missed = T(0);
  for (int64_t i = 0; i < n; ++i) {
    if (!plan.in[i]) {
      missed += a_row[i] * T(0);
      continue;
    }
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
  for (int64_t c = 0; c < D; ++c) o[c] = acc[c] + missed;
}

// Work order. Query-major (default): items are (b, q), all heads of a query in turn; the
// heads of a query sample around the same reference point, and the rows of one pixel for
// all heads are one contiguous NH*D block. Head-major (HEAD_MAJOR): items are (b, h,
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

template <bool HEAD_MAJOR, typename F>
inline void for_rows(const Dims& d, int64_t begin, int64_t end, F&& fn) {
  if constexpr (!HEAD_MAJOR) {
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
template <bool HEAD_MAJOR, typename T, typename Plan, typename Compute>
inline void pipelined_rows(const Dims& d, int64_t begin, int64_t end,
                           RowPlan<T>* plans, Plan&& plan, Compute&& compute) {
  int64_t pb = 0, pbq = 0, ph = 0;
  bool pending = false;
  int buf = 0;
  for_rows<HEAD_MAJOR>(d, begin, end, [&](int64_t b, int64_t bq, int64_t h) {
    plan(b, bq, h, plans[buf]);
    if (pending) compute(pb, pbq, ph, plans[buf ^ 1]);
    pb = b, pbq = bq, ph = h, pending = true;
    buf ^= 1;
  });
  if (pending) compute(pb, pbq, ph, plans[buf ^ 1]);
}

template <typename T, int DC, bool FUSED, bool PREFETCH, bool HEAD_MAJOR>
void forward_impl(const T* value, const int64_t* shapes, const int64_t* starts, const T* loc,
                  const T* attn, T* out, const Dims& d) {
  const int64_t D = DC > 0 ? DC : d.D;
  const int64_t n = d.L * d.P;
  const SampleTable<T> tab(shapes, starts, d);
  const int64_t grain = HEAD_MAJOR ? 1 : std::max<int64_t>(1, 256 / (d.NH * n));
  at::parallel_for(0, num_items(d, HEAD_MAJOR), grain, [&](int64_t begin, int64_t end) {
    RowPlan<T> plans[2] = {RowPlan<T>(n), RowPlan<T>(n)};
    std::vector<T> zeros(D, T(0));
    std::vector<T> acc_dyn(DC > 0 ? 0 : D);
    alignas(64) T acc_fix[DC > 0 ? DC : 1];
    T* acc = DC > 0 ? acc_fix : acc_dyn.data();
    pipelined_rows<HEAD_MAJOR, T>(
        d, begin, end, plans,
        [&](int64_t b, int64_t bq, int64_t h, RowPlan<T>& plan) {
          plan_row<PREFETCH>(value, tab, loc, b, bq, h, d, D, plan);
        },
        [&](int64_t, int64_t bq, int64_t h, const RowPlan<T>& plan) {
          forward_row<T, DC, FUSED, PREFETCH>(value, attn, out, bq, h, d, plan, zeros.data(), acc);
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

// dot(g, v_k) for the four corners and gv_k += w_k * g (atomically with ATOMIC), in one
// pass over D.
template <typename T, int DC, bool ATOMIC>
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
      if constexpr (ATOMIC) {
        for (int64_t j = 0; j < VL; ++j) {
#pragma omp atomic
          gv[k][c + j] += wk[k] * g[c + j];
        }
      } else {
        store<T>(gv[k] + c, load<T>(gv[k] + c) + wk[k] * gc);
      }
    }
  }
  T tail[4] = {0, 0, 0, 0};
  for (; c < D; ++c) {
    for (int k = 0; k < 4; ++k) {
      tail[k] += g[c] * v[k][c];
      if constexpr (ATOMIC) {
#pragma omp atomic
        gv[k][c] += wk[k] * g[c];
      } else {
        gv[k][c] += wk[k] * g[c];
      }
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
template <typename T, int DC, bool FUSED, bool PREFETCH, bool ATOMIC>
inline void backward_row(const T* value, const SampleTable<T>& tab, const T* attn, const T* gout,
                         T* gvalue, int64_t gshift, T* gloc, T* gattn, int64_t bq, int64_t h,
                         const Dims& d, const RowPlan<T>& plan, BackwardScratch<T>& scratch) {
  const int64_t D = DC > 0 ? DC : d.D;
  const int64_t n = d.L * d.P;
  const int64_t row = bq * d.NH + h;
  const T* g = gout + row * D;
  if constexpr (PREFETCH) {
    prefetch_ahead(gout, row, d.rows(), D);
    prefetch_ahead(attn, row, d.rows(), n);
  }
  const T* a_row = attn + row * n;
  T* ga_row = gattn + row * n;
  T* gl_row = gloc + 2 * row * n;
  for (int64_t i = 0; i < n; ++i) {
    if (!plan.in[i]) {
      // As in grid_sample's path: the location gradient of a sample off the map is
      // 0 * its weight (NaN for a NaN or inf weight), the weight's gradient is 0.
      const T zero = a_row[i] * T(0);
      ga_row[i] = T(0);
      gl_row[2 * i] = zero;
      gl_row[2 * i + 1] = zero;
      continue;
    }
    const int64_t* off = &plan.off[4 * i];
    const T w[4] = {plan.w[i], plan.w[n + i], plan.w[2 * n + i], plan.w[3 * n + i]};
    const T a = a_row[i];
    T dots[4] = {0, 0, 0, 0};
    if constexpr (FUSED) {
      const T* v[4];
      T* gv[4];
      T wa[4];
      for (int k = 0; k < 4; ++k) {
        v[k] = off[k] >= 0 ? value + off[k] : scratch.zeros.data();
        gv[k] = off[k] >= 0 ? gvalue + (off[k] - gshift) : scratch.sink.data();
        wa[k] = a * w[k];
      }
      fused_corner_grads<T, DC, ATOMIC>(g, v, gv, wa, D, dots);
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

// How the backward writes grad_value, resolved before the work starts.
enum class Strategy { kPrivate, kOwner, kAtomic };

struct BackwardPlan {
  Strategy strategy;
  int64_t threads;      // workers of the private strategy
  int64_t chunks;       // query chunks of the ownership strategy
  int64_t extra_bytes;  // private grad_value copies
};

// The range of items thread t of `threads` takes in the private strategy.
inline std::pair<int64_t, int64_t> item_range(int64_t items, int64_t threads, int64_t t) {
  return {items * t / threads, items * (t + 1) / threads};
}

// Whether thread t's first item shares its batch entry with thread t - 1's last one.
inline bool shares_first_batch(const Dims& d, bool head_major, int64_t items, int64_t threads,
                               int64_t t) {
  const auto [r0, r1] = item_range(items, threads, t);
  return r0 > 0 && r0 < r1 && item_batch(d, head_major, r0 - 1) == item_batch(d, head_major, r0);
}

// The strategy `o` gives for these sizes on at::get_num_threads() threads, with the
// extra memory of its private copies: auto takes private copies (at most threads - 1 batch
// slices) while they fit private_budget_bytes, else ownership, whose copies (chunks - 1
// whole grad_values) are kept within the same budget by taking fewer chunks.
BackwardPlan plan_backward(const Dims& d, const KernelOptions& o, int64_t elem_bytes) {
  const int64_t slice = d.K * d.NH * d.D;  // grad_value elements of one batch entry
  const int64_t items = num_items(d, o.head_major);
  const int64_t threads = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), items));
  if (o.backward == Backward::kAtomic) return {Strategy::kAtomic, threads, 1, 0};
  if (o.backward == Backward::kAuto) {
    int64_t copies = 0;
    for (int64_t t = 1; t < threads; ++t) {
      copies += shares_first_batch(d, o.head_major, items, threads, t);
    }
    const int64_t extra = copies * slice * elem_bytes;
    if (extra <= o.private_budget_bytes) return {Strategy::kPrivate, threads, 1, extra};
  }
  const int64_t pairs = d.B * d.NH;
  const int64_t numel_bytes = std::max<int64_t>(1, d.B * slice * elem_bytes);
  const int64_t chunks = std::max<int64_t>(
      1, std::min<int64_t>({(threads + pairs - 1) / pairs, d.Q, 8,
                            1 + o.private_budget_bytes / numel_bytes}));
  return {Strategy::kOwner, threads, chunks, (chunks - 1) * numel_bytes};
}

// Pointers of one backward call.
template <typename T>
struct BackwardArgs {
  const T *value, *loc, *attn, *gout;
  T *gvalue, *gloc, *gattn;
};

// Atomic strategy: items in parallel, grad_value added atomically.
template <typename T, int DC, bool FUSED, bool PREFETCH, bool HEAD_MAJOR>
void backward_atomic(const BackwardArgs<T>& a, const SampleTable<T>& tab, const Dims& d) {
  const int64_t D = DC > 0 ? DC : d.D;
  const int64_t n = d.L * d.P;
  const int64_t grain = HEAD_MAJOR ? 1 : std::max<int64_t>(1, 256 / (d.NH * n));
  at::parallel_for(0, num_items(d, HEAD_MAJOR), grain, [&](int64_t begin, int64_t end) {
    BackwardScratch<T> scratch(n, D);
    pipelined_rows<HEAD_MAJOR, T>(
        d, begin, end, scratch.plans,
        [&](int64_t b, int64_t bq, int64_t h, RowPlan<T>& p) {
          plan_row<PREFETCH>(a.value, tab, a.loc, b, bq, h, d, D, p, a.gvalue, 0);
        },
        [&](int64_t, int64_t bq, int64_t h, const RowPlan<T>& p) {
          backward_row<T, DC, FUSED, PREFETCH, true>(a.value, tab, a.attn, a.gout, a.gvalue, 0,
                                                     a.gloc, a.gattn, bq, h, d, p, scratch);
        });
  });
}

// Private strategy: thread t takes the t-th contiguous range of items and writes
// grad_value directly, except in the batch entry its range shares with the previous
// thread's (at most its first one), which it accumulates in a private copy of that entry;
// the copies are added at the end.
template <typename T, int DC, bool FUSED, bool PREFETCH, bool HEAD_MAJOR>
void backward_private(const BackwardArgs<T>& a, const SampleTable<T>& tab, const Dims& d,
                      int64_t threads) {
  const int64_t D = DC > 0 ? DC : d.D;
  const int64_t n = d.L * d.P;
  const int64_t slice = d.K * d.NH * D;
  const int64_t items = num_items(d, HEAD_MAJOR);
  std::vector<std::vector<T>> copies(threads);
  at::parallel_for(0, threads, 1, [&](int64_t begin, int64_t end) {
    BackwardScratch<T> scratch(n, D);
    for (int64_t t = begin; t < end; ++t) {
      const auto [r0, r1] = item_range(items, threads, t);
      if (r0 >= r1) continue;
      const int64_t shared_b = shares_first_batch(d, HEAD_MAJOR, items, threads, t)
                                   ? item_batch(d, HEAD_MAJOR, r0)
                                   : -1;
      if (shared_b >= 0) copies[t].assign(static_cast<size_t>(slice), T(0));
      T* copy = copies[t].data();
      auto plan = [&](int64_t b, int64_t bq, int64_t h, RowPlan<T>& p) {
        const bool own = b != shared_b;
        plan_row<PREFETCH>(a.value, tab, a.loc, b, bq, h, d, D, p, own ? a.gvalue : copy,
                           own ? 0 : b * slice);
      };
      pipelined_rows<HEAD_MAJOR, T>(
          d, r0, r1, scratch.plans, plan,
          [&](int64_t b, int64_t bq, int64_t h, const RowPlan<T>& p) {
            const bool own = b != shared_b;
            backward_row<T, DC, FUSED, PREFETCH, false>(
                a.value, tab, a.attn, a.gout, own ? a.gvalue : copy, own ? 0 : b * slice,
                a.gloc, a.gattn, bq, h, d, p, scratch);
          });
    }
  });
  for (int64_t t = 1; t < threads; ++t) {
    if (copies[t].empty()) continue;
    const int64_t b = item_batch(d, HEAD_MAJOR, item_range(items, threads, t).first);
    add_into(a.gvalue + b * slice, copies[t].data(), slice);
  }
}

// Ownership: item = (chunk, b, h), one (b, h) pair's queries of one chunk in turn (the
// order option does not apply); chunk 0 writes grad_value, the others private copies.
template <typename T, int DC, bool FUSED, bool PREFETCH>
void backward_owner(const BackwardArgs<T>& a, const SampleTable<T>& tab, const Dims& d,
                    int64_t chunks) {
  const int64_t D = DC > 0 ? DC : d.D;
  const int64_t n = d.L * d.P;
  const int64_t pairs = d.B * d.NH;
  const int64_t numel = d.B * d.K * d.NH * D;
  std::vector<T> copies(static_cast<size_t>((chunks - 1) * numel), T(0));
  at::parallel_for(0, chunks * pairs, 1, [&](int64_t begin, int64_t end) {
    BackwardScratch<T> scratch(n, D);
    for (int64_t item = begin; item < end; ++item) {
      const int64_t chunk = item / pairs;
      const int64_t b = (item % pairs) / d.NH;
      const int64_t h = item % d.NH;
      T* target = chunk == 0 ? a.gvalue : copies.data() + (chunk - 1) * numel;
      const int64_t q0 = d.Q * chunk / chunks, q1 = d.Q * (chunk + 1) / chunks;
      for (int64_t q = q0; q < q1; ++q) {
        plan_row<PREFETCH>(a.value, tab, a.loc, b, b * d.Q + q, h, d, D, scratch.plans[0],
                           target);
        backward_row<T, DC, FUSED, PREFETCH, false>(a.value, tab, a.attn, a.gout, target, 0,
                                                    a.gloc, a.gattn, b * d.Q + q, h, d,
                                                    scratch.plans[0], scratch);
      }
    }
  });
  for (int64_t k = 1; k < chunks; ++k) add_into(a.gvalue, copies.data() + (k - 1) * numel, numel);
}

template <typename T, int DC, bool FUSED, bool PREFETCH, bool HEAD_MAJOR>
void backward_impl(const BackwardArgs<T>& a, const int64_t* shapes, const int64_t* starts,
                   const Dims& d, const BackwardPlan& plan) {
  const SampleTable<T> tab(shapes, starts, d);
  switch (plan.strategy) {
    case Strategy::kAtomic:
      backward_atomic<T, DC, FUSED, PREFETCH, HEAD_MAJOR>(a, tab, d);
      break;
    case Strategy::kPrivate:
      backward_private<T, DC, FUSED, PREFETCH, HEAD_MAJOR>(a, tab, d, plan.threads);
      break;
    case Strategy::kOwner:
      backward_owner<T, DC, FUSED, PREFETCH>(a, tab, d, plan.chunks);
      break;
  }
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
  // Converted only where needed: each conversion is a dispatcher call, a fixed cost that
  // dominates small calls.
  const auto as = [](const at::Tensor& t, at::ScalarType type) {
    return (t.scalar_type() == type ? t : t.to(type)).contiguous();
  };
  Prepared r;
  r.value = value.contiguous();
  r.shapes = as(spatial_shapes, at::kLong);
  r.starts = as(level_start_index, at::kLong);
  r.loc = as(sampling_locations, value.scalar_type());
  r.attn = as(attention_weights, value.scalar_type());
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

// Compile-time head_dim for the common sizes in float32, the speed path; a runtime loop for
// other sizes and for float64, a checking path (fewer template instances: a faster build).
template <typename T, typename F>
inline void dispatch_d(int64_t D, F&& f) {
  if constexpr (std::is_same_v<T, float>) {
    switch (D) {
      case 16: return f(std::integral_constant<int, 16>{});
      case 32: return f(std::integral_constant<int, 32>{});
      case 64: return f(std::integral_constant<int, 64>{});
      default: break;
    }
  }
  f(std::integral_constant<int, 0>{});
}

// f(dc, fused, prefetch, head_major), each an integral_constant: the options as template
// arguments.
template <typename T, typename F>
inline void dispatch_options(int64_t D, const KernelOptions& o, F&& f) {
  dispatch_d<T>(D, [&](auto dc) {
    with_bool(o.fused, [&](auto fused) {
      with_bool(o.prefetch, [&](auto prefetch) {
        with_bool(o.head_major, [&](auto head_major) { f(dc, fused, prefetch, head_major); });
      });
    });
  });
}

}  // namespace

namespace npudet {

at::Tensor msda_forward(const at::Tensor& value, const at::Tensor& spatial_shapes,
                        const at::Tensor& level_start_index, const at::Tensor& sampling_locations,
                        const at::Tensor& attention_weights, const std::vector<int64_t>& options) {
  const KernelOptions o = parse_options(options);
  Prepared r = prepare(value, spatial_shapes, level_start_index, sampling_locations,
                       attention_weights);
  const Dims& d = r.d;
  at::Tensor out = at::empty({d.B, d.Q, d.NH * d.D}, r.value.options());
  AT_DISPATCH_FLOATING_TYPES(r.value.scalar_type(), "msda_cpu_forward", [&] {
    const auto* v = r.value.data_ptr<scalar_t>();
    const auto* sh = r.shapes.data_ptr<int64_t>();
    const auto* st = r.starts.data_ptr<int64_t>();
    const auto* lc = r.loc.data_ptr<scalar_t>();
    const auto* aw = r.attn.data_ptr<scalar_t>();
    auto* out_ptr = out.data_ptr<scalar_t>();
    dispatch_options<scalar_t>(d.D, o, [&](auto dc, auto fused, auto prefetch, auto head_major) {
      forward_impl<scalar_t, decltype(dc)::value, decltype(fused)::value,
                   decltype(prefetch)::value, decltype(head_major)::value>(v, sh, st, lc, aw,
                                                                           out_ptr, d);
    });
  });
  return out;
}

std::vector<at::Tensor> msda_backward(const at::Tensor& grad_output, const at::Tensor& value,
                                      const at::Tensor& spatial_shapes,
                                      const at::Tensor& level_start_index,
                                      const at::Tensor& sampling_locations,
                                      const at::Tensor& attention_weights,
                                      const std::vector<int64_t>& options) {
  const KernelOptions o = parse_options(options);
  Prepared r = prepare(value, spatial_shapes, level_start_index, sampling_locations,
                       attention_weights);
  const Dims& d = r.d;
  TORCH_CHECK(grad_output.numel() == d.B * d.Q * d.NH * d.D,
              "grad_output: expected (bs, num_queries, num_heads * head_dim)");
  at::Tensor g = grad_output.to(r.value.scalar_type()).contiguous();
  at::Tensor gvalue = at::zeros_like(r.value);
  at::Tensor gloc = at::empty_like(r.loc);
  at::Tensor gattn = at::empty_like(r.attn);
  const BackwardPlan plan = plan_backward(d, o, r.value.element_size());
  AT_DISPATCH_FLOATING_TYPES(r.value.scalar_type(), "msda_cpu_backward", [&] {
    const BackwardArgs<scalar_t> args{r.value.data_ptr<scalar_t>(), r.loc.data_ptr<scalar_t>(),
                                      r.attn.data_ptr<scalar_t>(),  g.data_ptr<scalar_t>(),
                                      gvalue.data_ptr<scalar_t>(),  gloc.data_ptr<scalar_t>(),
                                      gattn.data_ptr<scalar_t>()};
    const auto* sh = r.shapes.data_ptr<int64_t>();
    const auto* st = r.starts.data_ptr<int64_t>();
    dispatch_options<scalar_t>(d.D, o, [&](auto dc, auto fused, auto prefetch, auto head_major) {
      backward_impl<scalar_t, decltype(dc)::value, decltype(fused)::value,
                    decltype(prefetch)::value, decltype(head_major)::value>(args, sh, st, d,
                                                                            plan);
    });
  });
  return {gvalue, gloc, gattn};
}

int64_t num_options() { return static_cast<int64_t>(kNumOptions); }

std::vector<int64_t> backward_plan(int64_t B, int64_t K, int64_t NH, int64_t D, int64_t Q,
                                   int64_t elem_bytes, const std::vector<int64_t>& options) {
  const KernelOptions o = parse_options(options);
  TORCH_CHECK_VALUE(B > 0 && K > 0 && NH > 0 && D > 0 && Q > 0 && elem_bytes > 0,
                    "backward_plan: expected positive sizes");
  const BackwardPlan p = plan_backward(Dims{B, K, NH, D, 1, Q, 1}, o, elem_bytes);
  return {static_cast<int64_t>(p.strategy), p.chunks, p.extra_bytes};
}

at::Tensor gather_probe(const at::Tensor& rows, const at::Tensor& top_left,
                        const at::Tensor& corners, const at::Tensor& row_step, int64_t x_step,
                        int64_t grain) {
  TORCH_CHECK_VALUE(rows.dim() == 2 && rows.scalar_type() == at::kFloat && rows.is_contiguous(),
                    "rows: expected a contiguous float32 (num_rows, D) tensor");
  TORCH_CHECK_VALUE(
      top_left.dim() == 2 && top_left.scalar_type() == at::kInt && top_left.is_contiguous(),
      "top_left: expected a contiguous int32 (N, S) tensor");
  TORCH_CHECK_VALUE(corners.sizes() == top_left.sizes() && corners.scalar_type() == at::kByte &&
                        corners.is_contiguous(),
                    "corners: expected a contiguous uint8 tensor shaped like top_left");
  TORCH_CHECK_VALUE(row_step.dim() == 1 && row_step.size(0) == top_left.size(1) &&
                        row_step.scalar_type() == at::kLong && row_step.is_contiguous(),
                    "row_step: expected a contiguous int64 (S,) tensor");
  TORCH_CHECK_VALUE(grain > 0, "grain: expected a positive integer");
  const int64_t N = top_left.size(0), S = top_left.size(1), Dd = rows.size(1);
  const int32_t* tl = top_left.data_ptr<int32_t>();
  const uint8_t* cm = corners.data_ptr<uint8_t>();
  const int64_t* step = row_step.data_ptr<int64_t>();
  // Corner j of sample i lies delta[j] rows after its top-left one; bit j of corners says
  // it is inside the map (the plan was made by Python, which checked every index).
  at::Tensor out = at::empty({N, Dd}, rows.options());
  const float* v = rows.data_ptr<float>();
  float* o = out.data_ptr<float>();
  dispatch_d<float>(Dd, [&](auto dc) {
    constexpr int DC = decltype(dc)::value;
    const int64_t D = DC > 0 ? DC : Dd;
    // A missing corner reads a zero row, and the four corners of a sample are summed in one
    // pass over D, as the fused forward does (one accumulator update per sample, not per
    // corner).
    const std::vector<float> zeros(D, 0.0f);
    at::parallel_for(0, N, grain, [&](int64_t begin, int64_t end) {
      std::vector<float> acc(D);
      const auto corner_rows = [&](int64_t r, int64_t i, const float* (&c)[4]) {
        const uint8_t m = cm[r * S + i];
        const int64_t k = tl[r * S + i];
        const int64_t delta[4] = {0, x_step, step[i], step[i] + x_step};
        for (int j = 0; j < 4; ++j) c[j] = (m >> j) & 1u ? v + (k + delta[j]) * D : zeros.data();
        return m != 0;
      };
      for (int64_t r = begin; r < end; ++r) {
        if (r + 1 < end) {
          for (int64_t i = 0; i < S; ++i) {
            const float* c[4];
            if (!corner_rows(r + 1, i, c)) continue;
            for (const float* row : c) prefetch_row<0>(row, D);
          }
        }
        std::fill(acc.begin(), acc.end(), 0.0f);
        float* a = acc.data();
        for (int64_t i = 0; i < S; ++i) {
          const float* c[4];
          if (!corner_rows(r, i, c)) continue;
          const float *v0 = c[0], *v1 = c[1], *v2 = c[2], *v3 = c[3];
#pragma omp simd
          for (int64_t e = 0; e < D; ++e) a[e] += v0[e] + v1[e] + v2[e] + v3[e];
        }
        std::memcpy(o + r * D, a, D * sizeof(float));
      }
    });
  });
  return out;
}

}  // namespace npudet
