// The CPU kernels as torch ops with their autograd in C++, so that a call from Python is one
// dispatcher call: no Python between the op and the kernel, forward or backward.
//
//   npudet::msda_cpu_forward(value, spatial_shapes, level_start_index, sampling_locations,
//                            attention_weights, int[] options) -> Tensor       (CPU, Autograd)
//   npudet::msda_cpu_backward(grad_output, <the same five>, int[] options)
//                            -> (grad value, grad locations, grad weights)     (CPU)
//
// The schemas and the fake (meta) kernels are defined in Python (cpu_impl.py), so that
// torch.compile can trace a call before this library is built. Any floating dtypes are
// taken: float16 / bfloat16 are computed in float32, locations and weights in value's
// compute dtype; the output has value's dtype and each gradient its input's.
#include "msda_cpu.h"

#include <torch/autograd.h>
#include <torch/library.h>

#include <tuple>

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

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

const c10::TypedOperatorHandle<decltype(forward_cpu)>& forward_op() {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("npudet::msda_cpu_forward", "")
                             .typed<decltype(forward_cpu)>();
  return op;
}

class MSDACpuFunction : public torch::autograd::Function<MSDACpuFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& value,
                            const at::Tensor& spatial_shapes, const at::Tensor& level_start_index,
                            const at::Tensor& sampling_locations,
                            const at::Tensor& attention_weights, at::IntArrayRef options) {
    ctx->saved_data["options"] = options.vec();
    ctx->save_for_backward(
        {value, spatial_shapes, level_start_index, sampling_locations, attention_weights});
    at::AutoDispatchBelowADInplaceOrView guard;
    return forward_op().call(value, spatial_shapes, level_start_index, sampling_locations,
                   attention_weights, options);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const std::vector<int64_t> options = ctx->saved_data["options"].toIntVector();
    static auto op = c10::Dispatcher::singleton()
                         .findSchemaOrThrow("npudet::msda_cpu_backward", "")
                         .typed<decltype(backward_cpu)>();
    auto [grad_value, grad_loc, grad_attn] =
        op.call(grads[0], saved[0], saved[1], saved[2], saved[3], saved[4], options);
    return {grad_value, at::Tensor(), at::Tensor(), grad_loc, grad_attn, at::Tensor()};
  }
};

at::Tensor forward_autograd(const at::Tensor& value, const at::Tensor& spatial_shapes,
                            const at::Tensor& level_start_index,
                            const at::Tensor& sampling_locations,
                            const at::Tensor& attention_weights, at::IntArrayRef options) {
  if (!at::GradMode::is_enabled() || !(value.requires_grad() ||
                                       sampling_locations.requires_grad() ||
                                       attention_weights.requires_grad())) {
    // Nothing to differentiate: no graph node, no saved tensors (the no-grad call's cost).
    at::AutoDispatchBelowADInplaceOrView guard;
    return forward_op().call(value, spatial_shapes, level_start_index, sampling_locations,
                             attention_weights, options);
  }
  return MSDACpuFunction::apply(value, spatial_shapes, level_start_index, sampling_locations,
                                attention_weights, options);
}

}  // namespace

TORCH_LIBRARY_IMPL(npudet, CPU, m) {
  m.impl("msda_cpu_forward", &forward_cpu);
  m.impl("msda_cpu_backward", &backward_cpu);
}

TORCH_LIBRARY_IMPL(npudet, Autograd, m) { m.impl("msda_cpu_forward", &forward_autograd); }
