// The npudet::msda_cpu_* operators: schemas, CPU kernels and Meta (shape) kernels. This
// library links libtorch only, so one build loads into any process that has libtorch (a
// Python one through torch.ops.load_library, or a C++ program running an AOTInductor
// package) and torch.export / AOTInductor see an op they can trace and call.
//
//   npudet::msda_cpu_forward(value, spatial_shapes, level_start_index, sampling_locations,
//                            attention_weights, int[] options) -> Tensor
//   npudet::msda_cpu_backward(grad_output, <the same five>, int[] options)
//                            -> (grad value, grad locations, grad weights)
//   npudet::_msda_cpu_num_options() -> int                           (the tools' probes)
//   npudet::_msda_cpu_backward_plan(B, K, NH, D, Q, elem_bytes, options) -> int[]
//   npudet::_msda_cpu_gather_probe(rows, top_left, corners, row_step, x_step, grain) -> Tensor
//
// Autograd is another library (msda_cpu_autograd.cpp), so a failure to build it leaves these
// kernels usable. Any floating dtypes are taken: float16 / bfloat16 are computed in float32,
// locations and weights in value's compute dtype; the output has value's dtype and each
// gradient its input's.
#include "msda_cpu.h"

#include <ATen/ATen.h>
#include <torch/library.h>

#include <tuple>
#include <vector>

namespace {

at::ScalarType compute_type(at::ScalarType t) {
  return t == at::kFloat || t == at::kDouble ? t : at::kFloat;
}

// t in dtype `type`, without a dispatcher call when it already is (the common case).
at::Tensor as_type(const at::Tensor& t, at::ScalarType type) {
  return t.scalar_type() == type ? t : t.to(type);
}

at::Tensor forward_cpu(const at::Tensor& value, const at::Tensor& spatial_shapes,
                       const at::Tensor& level_start_index, const at::Tensor& sampling_locations,
                       const at::Tensor& attention_weights, at::IntArrayRef options) {
  const at::ScalarType ct = compute_type(value.scalar_type());
  return as_type(npudet::msda_forward(as_type(value, ct), spatial_shapes, level_start_index,
                                      as_type(sampling_locations, ct),
                                      as_type(attention_weights, ct), options.vec()),
                 value.scalar_type());
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> backward_cpu(
    const at::Tensor& grad_output, const at::Tensor& value, const at::Tensor& spatial_shapes,
    const at::Tensor& level_start_index, const at::Tensor& sampling_locations,
    const at::Tensor& attention_weights, at::IntArrayRef options) {
  const at::ScalarType ct = compute_type(value.scalar_type());
  std::vector<at::Tensor> grads = npudet::msda_backward(
      as_type(grad_output, ct), as_type(value, ct), spatial_shapes, level_start_index,
      as_type(sampling_locations, ct), as_type(attention_weights, ct), options.vec());
  return {as_type(grads[0], value.scalar_type()),
          as_type(grads[1], sampling_locations.scalar_type()),
          as_type(grads[2], attention_weights.scalar_type())};
}

// Shapes only, from symbolic sizes: torch.export and torch.compile trace through these with
// the batch, query count and map sizes left dynamic (nothing here reads a tensor's values).
at::Tensor forward_meta(const at::Tensor& value, const at::Tensor&, const at::Tensor&,
                        const at::Tensor& sampling_locations, const at::Tensor&,
                        at::IntArrayRef) {
  const std::vector<c10::SymInt> size{sampling_locations.sym_size(0),
                                      sampling_locations.sym_size(1),
                                      value.sym_size(2) * value.sym_size(3)};
  return at::empty_symint(size, value.options());
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> backward_meta(
    const at::Tensor&, const at::Tensor& value, const at::Tensor&, const at::Tensor&,
    const at::Tensor& sampling_locations, const at::Tensor& attention_weights, at::IntArrayRef) {
  const auto like = [](const at::Tensor& t) {
    return at::empty_like(t, at::MemoryFormat::Contiguous);
  };
  return {like(value), like(sampling_locations), like(attention_weights)};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(npudet, m) {
  m.def(
      "msda_cpu_forward(Tensor value, Tensor spatial_shapes, Tensor level_start_index, "
      "Tensor sampling_locations, Tensor attention_weights, int[] options) -> Tensor");
  m.def(
      "msda_cpu_backward(Tensor grad_output, Tensor value, Tensor spatial_shapes, "
      "Tensor level_start_index, Tensor sampling_locations, Tensor attention_weights, "
      "int[] options) -> (Tensor, Tensor, Tensor)");
  m.def("_msda_cpu_num_options() -> int", &npudet::num_options);
  m.def(
      "_msda_cpu_backward_plan(int B, int K, int NH, int D, int Q, int elem_bytes, "
      "int[] options) -> int[]",
      [](int64_t B, int64_t K, int64_t NH, int64_t D, int64_t Q, int64_t elem_bytes,
         at::IntArrayRef options) {
        return npudet::backward_plan(B, K, NH, D, Q, elem_bytes, options.vec());
      });
  m.def(
      "_msda_cpu_gather_probe(Tensor rows, Tensor top_left, Tensor corners, Tensor row_step, "
      "int x_step, int grain) -> Tensor");
}

TORCH_LIBRARY_IMPL(npudet, CPU, m) {
  m.impl("msda_cpu_forward", &forward_cpu);
  m.impl("msda_cpu_backward", &backward_cpu);
  m.impl("_msda_cpu_gather_probe", &npudet::gather_probe);
}

TORCH_LIBRARY_IMPL(npudet, Meta, m) {
  m.impl("msda_cpu_forward", &forward_meta);
  m.impl("msda_cpu_backward", &backward_meta);
}
