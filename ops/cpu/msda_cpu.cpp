// Fused multi-scale deformable attention for CPU (forward and backward), OpenMP via
// at::parallel_for. Semantics are those of grid_sample(bilinear, zeros, align_corners=False):
// pixel centre at (i + 0.5) / W, corners outside the map contribute zero.
//
// Layouts (all contiguous):
//   value    (B, K, NH, D)      D contiguous, a pixel of one head is one row of D values
//   loc      (B, Q, NH, L, P, 2) x, y in [0, 1]
//   attn     (B, Q, NH, L, P)
//   out      (B, Q, NH, D)
// Design:
//   * nothing sampled is materialised: each corner is weighted and accumulated at once
//     into a register/stack accumulator (forward) or scattered at once (backward);
//   * kFused: the four corners of a sample are read in ONE pass over D (out-of-map corners
//     point at a zero row / a sink row), instead of one pass per corner;
//   * backward without contention: work items are (batch, head, query chunk) and a
//     (batch, head) slice of grad_value is owned by one item; when there are fewer
//     (batch, head) pairs than threads, chunks > 0 accumulate into private copies that
//     are reduced at the end. kAtomic instead parallelises over queries with atomic adds.
//   * all offsets are int64.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace {

constexpr int64_t kFused = 1;
constexpr int64_t kAtomic = 2;
constexpr int64_t kPrivate = 4;

struct Dims {
  int64_t B, K, NH, D, L, Q, P;
};

// Bilinear corners of one sample. Returns false when no corner lies inside the map
// (also for NaN/inf coordinates, which fail every comparison). x = -1 is kept: its right
// corner has weight 0 but a gradient, exactly as in grid_sample.
template <typename T>
inline bool corners(T lx, T ly, int64_t H, int64_t W, int64_t row_stride, int64_t* off,
                    T* w, T& fx, T& fy) {
  const T x = lx * static_cast<T>(W) - T(0.5);
  const T y = ly * static_cast<T>(H) - T(0.5);
  if (!(y >= T(-1) && x >= T(-1) && y < static_cast<T>(H) && x < static_cast<T>(W))) return false;
  const T xf = std::floor(x);
  const T yf = std::floor(y);
  const int64_t x0 = static_cast<int64_t>(xf);
  const int64_t y0 = static_cast<int64_t>(yf);
  fx = x - xf;
  fy = y - yf;
  const T gx = T(1) - fx;
  const T gy = T(1) - fy;
  w[0] = gy * gx;
  w[1] = gy * fx;
  w[2] = fy * gx;
  w[3] = fy * fx;
  const bool xa = x0 >= 0, xb = x0 + 1 < W, ya = y0 >= 0, yb = y0 + 1 < H;
  off[0] = (ya && xa) ? (y0 * W + x0) * row_stride : -1;
  off[1] = (ya && xb) ? (y0 * W + x0 + 1) * row_stride : -1;
  off[2] = (yb && xa) ? ((y0 + 1) * W + x0) * row_stride : -1;
  off[3] = (yb && xb) ? ((y0 + 1) * W + x0 + 1) * row_stride : -1;
  return true;
}

template <typename T, int DC, bool FUSED>
void forward_impl(const T* value, const int64_t* shapes, const int64_t* starts, const T* loc,
                  const T* attn, T* out, const Dims& d) {
  const int64_t D = DC > 0 ? DC : d.D;
  const int64_t row_stride = d.NH * D;
  const int64_t grain = std::max<int64_t>(1, 256 / (d.NH * d.L * d.P));
  at::parallel_for(0, d.B * d.Q, grain, [&](int64_t begin, int64_t end) {
    std::vector<T> zeros(D, T(0));
    std::vector<T> acc_dyn(DC > 0 ? 0 : D);
    alignas(64) T acc_fix[DC > 0 ? DC : 1];
    T* acc = DC > 0 ? acc_fix : acc_dyn.data();
    for (int64_t bq = begin; bq < end; ++bq) {
      const int64_t b = bq / d.Q;
      for (int64_t h = 0; h < d.NH; ++h) {
        for (int64_t c = 0; c < D; ++c) acc[c] = T(0);
        const int64_t s0 = (bq * d.NH + h) * d.L * d.P;
        for (int64_t l = 0; l < d.L; ++l) {
          const int64_t H = shapes[2 * l], W = shapes[2 * l + 1];
          const T* vbase = value + ((b * d.K + starts[l]) * d.NH + h) * D;
          for (int64_t p = 0; p < d.P; ++p) {
            const int64_t s = s0 + l * d.P + p;
            int64_t off[4];
            T w[4], fx, fy;
            if (!corners(loc[2 * s], loc[2 * s + 1], H, W, row_stride, off, w, fx, fy)) continue;
            const T a = attn[s];
            if (FUSED) {
              const T* v0 = off[0] >= 0 ? vbase + off[0] : zeros.data();
              const T* v1 = off[1] >= 0 ? vbase + off[1] : zeros.data();
              const T* v2 = off[2] >= 0 ? vbase + off[2] : zeros.data();
              const T* v3 = off[3] >= 0 ? vbase + off[3] : zeros.data();
              const T w0 = a * w[0], w1 = a * w[1], w2 = a * w[2], w3 = a * w[3];
#pragma omp simd
              for (int64_t c = 0; c < D; ++c) {
                acc[c] += w0 * v0[c] + w1 * v1[c] + w2 * v2[c] + w3 * v3[c];
              }
            } else {
              for (int k = 0; k < 4; ++k) {
                if (off[k] < 0) continue;
                const T wk = a * w[k];
                const T* v = vbase + off[k];
#pragma omp simd
                for (int64_t c = 0; c < D; ++c) acc[c] += wk * v[c];
              }
            }
          }
        }
        T* o = out + (bq * d.NH + h) * D;
        for (int64_t c = 0; c < D; ++c) o[c] = acc[c];
      }
    }
  });
}

template <typename T>
inline void add_row(T* dst, const T* g, T w, int64_t D, bool atomic) {
  if (atomic) {
    for (int64_t c = 0; c < D; ++c) {
#pragma omp atomic
      dst[c] += w * g[c];
    }
  } else {
#pragma omp simd
    for (int64_t c = 0; c < D; ++c) dst[c] += w * g[c];
  }
}

// Gradients of one (b, q, h) output row over all its levels and points.
template <typename T, int DC, bool FUSED, bool ATOMIC>
inline void backward_row(const T* value, const int64_t* shapes, const int64_t* starts,
                         const T* loc, const T* attn, const T* g, T* gvalue, T* gloc, T* gattn,
                         int64_t b, int64_t bq, int64_t h, const Dims& d, const T* zeros,
                         T* sink) {
  const int64_t D = DC > 0 ? DC : d.D;
  const int64_t row_stride = d.NH * D;
  const int64_t s0 = (bq * d.NH + h) * d.L * d.P;
  for (int64_t l = 0; l < d.L; ++l) {
    const int64_t H = shapes[2 * l], W = shapes[2 * l + 1];
    const int64_t base = ((b * d.K + starts[l]) * d.NH + h) * D;
    const T* vbase = value + base;
    T* gbase = gvalue + base;
    for (int64_t p = 0; p < d.P; ++p) {
      const int64_t s = s0 + l * d.P + p;
      int64_t off[4];
      T w[4], fx, fy;
      if (!corners(loc[2 * s], loc[2 * s + 1], H, W, row_stride, off, w, fx, fy)) {
        gattn[s] = T(0);
        gloc[2 * s] = T(0);
        gloc[2 * s + 1] = T(0);
        continue;
      }
      const T a = attn[s];
      T dot0 = 0, dot1 = 0, dot2 = 0, dot3 = 0;
      if (FUSED && !ATOMIC) {
        const T* v0 = off[0] >= 0 ? vbase + off[0] : zeros;
        const T* v1 = off[1] >= 0 ? vbase + off[1] : zeros;
        const T* v2 = off[2] >= 0 ? vbase + off[2] : zeros;
        const T* v3 = off[3] >= 0 ? vbase + off[3] : zeros;
        T* g0 = off[0] >= 0 ? gbase + off[0] : sink;
        T* g1 = off[1] >= 0 ? gbase + off[1] : sink;
        T* g2 = off[2] >= 0 ? gbase + off[2] : sink;
        T* g3 = off[3] >= 0 ? gbase + off[3] : sink;
        const T w0 = a * w[0], w1 = a * w[1], w2 = a * w[2], w3 = a * w[3];
#pragma omp simd reduction(+ : dot0, dot1, dot2, dot3)
        for (int64_t c = 0; c < D; ++c) {
          const T gc = g[c];
          dot0 += gc * v0[c];
          dot1 += gc * v1[c];
          dot2 += gc * v2[c];
          dot3 += gc * v3[c];
          g0[c] += w0 * gc;
          g1[c] += w1 * gc;
          g2[c] += w2 * gc;
          g3[c] += w3 * gc;
        }
      } else {
        T dots[4] = {0, 0, 0, 0};
        for (int k = 0; k < 4; ++k) {
          if (off[k] < 0) continue;
          const T* v = vbase + off[k];
          T dk = 0;
#pragma omp simd reduction(+ : dk)
          for (int64_t c = 0; c < D; ++c) dk += g[c] * v[c];
          dots[k] = dk;
          add_row(gbase + off[k], g, a * w[k], D, ATOMIC);
        }
        dot0 = dots[0];
        dot1 = dots[1];
        dot2 = dots[2];
        dot3 = dots[3];
      }
      gattn[s] = w[0] * dot0 + w[1] * dot1 + w[2] * dot2 + w[3] * dot3;
      const T gx = (T(1) - fy) * (dot1 - dot0) + fy * (dot3 - dot2);
      const T gy = (T(1) - fx) * (dot2 - dot0) + fx * (dot3 - dot1);
      gloc[2 * s] = a * gx * static_cast<T>(W);
      gloc[2 * s + 1] = a * gy * static_cast<T>(H);
    }
  }
}

template <typename T, int DC, bool FUSED, bool ATOMIC, bool PRIVATE>
void backward_impl(const T* value, const int64_t* shapes, const int64_t* starts, const T* loc,
                   const T* attn, const T* gout, T* gvalue, T* gloc, T* gattn, const Dims& d) {
  const int64_t D = DC > 0 ? DC : d.D;
  if (ATOMIC) {
    const int64_t grain = std::max<int64_t>(1, 256 / (d.NH * d.L * d.P));
    at::parallel_for(0, d.B * d.Q, grain, [&](int64_t begin, int64_t end) {
      std::vector<T> zeros(D, T(0)), sink(D, T(0));
      for (int64_t bq = begin; bq < end; ++bq) {
        const int64_t b = bq / d.Q;
        for (int64_t h = 0; h < d.NH; ++h) {
          backward_row<T, DC, FUSED, true>(value, shapes, starts, loc, attn,
                                           gout + (bq * d.NH + h) * D, gvalue, gloc, gattn, b,
                                           bq, h, d, zeros.data(), sink.data());
        }
      }
    });
    return;
  }
  const int64_t numel_all = d.B * d.K * d.NH * D;
  if (PRIVATE) {
    // Query-major like the forward (all heads of a pixel row together, good locality);
    // each of T contiguous query ranges accumulates into its own copy, reduced below.
    const int64_t T_ = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), d.B * d.Q));
    std::vector<T> priv(static_cast<size_t>((T_ - 1) * numel_all), T(0));
    at::parallel_for(0, T_, 1, [&](int64_t begin, int64_t end) {
      std::vector<T> zeros(D, T(0)), sink(D, T(0));
      for (int64_t t = begin; t < end; ++t) {
        T* target = t == 0 ? gvalue : priv.data() + (t - 1) * numel_all;
        const int64_t r0 = d.B * d.Q * t / T_, r1 = d.B * d.Q * (t + 1) / T_;
        for (int64_t bq = r0; bq < r1; ++bq) {
          const int64_t b = bq / d.Q;
          for (int64_t h = 0; h < d.NH; ++h) {
            backward_row<T, DC, FUSED, false>(value, shapes, starts, loc, attn,
                                              gout + (bq * d.NH + h) * D, target, gloc, gattn,
                                              b, bq, h, d, zeros.data(), sink.data());
          }
        }
      }
    });
    if (T_ > 1) {
      at::parallel_for(0, numel_all, 4096, [&](int64_t begin, int64_t end) {
        for (int64_t k = 1; k < T_; ++k) {
          const T* src = priv.data() + (k - 1) * numel_all;
#pragma omp simd
          for (int64_t i = begin; i < end; ++i) gvalue[i] += src[i];
        }
      });
    }
    return;
  }
  // Ownership partition: item = (chunk, b, h); chunk 0 writes grad_value itself, the
  // other chunks write private copies reduced below.
  const int64_t pairs = d.B * d.NH;
  const int64_t threads = at::get_num_threads();
  const int64_t chunks = std::min<int64_t>({(threads + pairs - 1) / pairs, d.Q, 8});
  const int64_t numel = d.B * d.K * d.NH * D;
  std::vector<T> partial(static_cast<size_t>((chunks - 1) * numel), T(0));
  at::parallel_for(0, chunks * pairs, 1, [&](int64_t begin, int64_t end) {
    std::vector<T> zeros(D, T(0)), sink(D, T(0));
    for (int64_t item = begin; item < end; ++item) {
      const int64_t chunk = item / pairs;
      const int64_t b = (item % pairs) / d.NH;
      const int64_t h = item % d.NH;
      T* target = chunk == 0 ? gvalue : partial.data() + (chunk - 1) * numel;
      const int64_t q0 = d.Q * chunk / chunks, q1 = d.Q * (chunk + 1) / chunks;
      for (int64_t q = q0; q < q1; ++q) {
        const int64_t bq = b * d.Q + q;
        backward_row<T, DC, FUSED, false>(value, shapes, starts, loc, attn,
                                          gout + (bq * d.NH + h) * D, target, gloc, gattn, b,
                                          bq, h, d, zeros.data(), sink.data());
      }
    }
  });
  if (chunks > 1) {
    at::parallel_for(0, numel, 4096, [&](int64_t begin, int64_t end) {
      for (int64_t k = 1; k < chunks; ++k) {
        const T* src = partial.data() + (k - 1) * numel;
#pragma omp simd
        for (int64_t i = begin; i < end; ++i) gvalue[i] += src[i];
      }
    });
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
  Prepared r;
  r.value = value.contiguous();
  r.shapes = spatial_shapes.to(at::kLong).contiguous();
  r.starts = level_start_index.to(at::kLong).contiguous();
  r.loc = sampling_locations.to(value.scalar_type()).contiguous();
  r.attn = attention_weights.to(value.scalar_type()).contiguous();
  r.d = Dims{value.size(0), value.size(1), value.size(2), value.size(3),
             spatial_shapes.size(0), sampling_locations.size(1), sampling_locations.size(4)};
  const Dims& d = r.d;
  TORCH_CHECK(r.shapes.dim() == 2 && r.shapes.size(1) == 2, "spatial_shapes: expected (num_levels, 2)");
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
    TORCH_CHECK(st[l] == total, "level_start_index: expected cumulative H*W of spatial_shapes");
    total += sh[2 * l] * sh[2 * l + 1];
  }
  TORCH_CHECK(total == d.K, "spatial_shapes: sum of H*W must equal value.shape[1]");
  return r;
}

#define NPUDET_DISPATCH_D(D, DC, ...)      \
  switch (D) {                             \
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
  AT_DISPATCH_FLOATING_TYPES(r.value.scalar_type(), "msda_cpu_forward", [&] {
    const auto* v = r.value.data_ptr<scalar_t>();
    const auto* sh = r.shapes.data_ptr<int64_t>();
    const auto* st = r.starts.data_ptr<int64_t>();
    const auto* lc = r.loc.data_ptr<scalar_t>();
    const auto* aw = r.attn.data_ptr<scalar_t>();
    auto* o = out.data_ptr<scalar_t>();
    NPUDET_DISPATCH_D(d.D, DC, [&] {
      if (fused) forward_impl<scalar_t, DC, true>(v, sh, st, lc, aw, o, d);
      else forward_impl<scalar_t, DC, false>(v, sh, st, lc, aw, o, d);
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
  const bool atomic = variant & kAtomic;
  const bool priv = variant & kPrivate;
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
      if (atomic) {
        if (fused) backward_impl<scalar_t, DC, true, true, false>(v, sh, st, lc, aw, go, gv, gl, ga, d);
        else backward_impl<scalar_t, DC, false, true, false>(v, sh, st, lc, aw, go, gv, gl, ga, d);
      } else if (priv) {
        if (fused) backward_impl<scalar_t, DC, true, false, true>(v, sh, st, lc, aw, go, gv, gl, ga, d);
        else backward_impl<scalar_t, DC, false, false, true>(v, sh, st, lc, aw, go, gv, gl, ga, d);
      } else {
        if (fused) backward_impl<scalar_t, DC, true, false, false>(v, sh, st, lc, aw, go, gv, gl, ga, d);
        else backward_impl<scalar_t, DC, false, false, false>(v, sh, st, lc, aw, go, gv, gl, ga, d);
      }
    });
  });
  return {gvalue, gloc, gattn};
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("forward", &msda_forward, "MSDA forward (CPU)");
  m.def("backward", &msda_backward, "MSDA backward (CPU): grad value, locations, weights");
}
