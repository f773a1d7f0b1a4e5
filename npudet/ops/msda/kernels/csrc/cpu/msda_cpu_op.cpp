// The CPU kernels as torch ops with their autograd in C++, so that a call from Python is one
// dispatcher call: no Python between the op and the kernel, forward or backward. The
// backward node is written as ATen's generated ones are (a Node with its saved variables),
// not as a torch::autograd::Function: measured on a 1-query call, the custom-function node
// cost 13 us more per forward+backward (65 vs 78 us; one ATen op with autograd: 40 us).
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
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/library.h>

#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

namespace {

using torch::autograd::SavedVariable;
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

const c10::TypedOperatorHandle<decltype(backward_cpu)>& backward_op() {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("npudet::msda_cpu_backward", "")
                             .typed<decltype(backward_cpu)>();
  return op;
}

// torch >= 2.13 holds autograd nodes in c10::intrusive_ptr; earlier releases in shared_ptr
// with torch::autograd::deleteNode (found by argument-dependent lookup through Node), which
// frees a long graph without deep recursion.
template <typename T>
auto make_node() {
  if constexpr (std::is_base_of_v<c10::intrusive_ptr_target, T>) {
    return c10::make_intrusive<T>();
  } else {
    return std::shared_ptr<T>(new T(), [](T* node) { deleteNode(node); });
  }
}

// Gradients of value, sampling_locations and attention_weights (the node's next edges, in
// that order) from the output's.
struct MSDACpuBackward final : public torch::autograd::TraceableFunction {
  SavedVariable value, shapes, starts, loc, attn;
  std::vector<int64_t> options;

  std::string name() const override { return "MSDACpuBackward"; }

  void release_variables() override {
    std::lock_guard<std::mutex> lock(mutex_);
    value.reset_data();
    shapes.reset_data();
    starts.reset_data();
    loc.reset_data();
    attn.reset_data();
  }

  variable_list apply(variable_list&& grads) override {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!grads[0].defined()) return {at::Tensor(), at::Tensor(), at::Tensor()};
    auto [grad_value, grad_loc, grad_attn] =
        backward_op().call(grads[0], value.unpack(), shapes.unpack(), starts.unpack(),
                           loc.unpack(), attn.unpack(), options);
    return {grad_value, grad_loc, grad_attn};
  }
};

at::Tensor forward_autograd(const at::Tensor& value, const at::Tensor& spatial_shapes,
                            const at::Tensor& level_start_index,
                            const at::Tensor& sampling_locations,
                            const at::Tensor& attention_weights, at::IntArrayRef options) {
  at::Tensor out;
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    out = forward_op().call(value, spatial_shapes, level_start_index, sampling_locations,
                            attention_weights, options);
  }
  if (!torch::autograd::compute_requires_grad(value, sampling_locations, attention_weights)) {
    return out;  // nothing to differentiate: no graph node, no saved tensors
  }
  auto node = make_node<MSDACpuBackward>();
  node->set_next_edges(
      torch::autograd::collect_next_edges(value, sampling_locations, attention_weights));
  node->value = SavedVariable(value, /*is_output=*/false);
  node->shapes = SavedVariable(spatial_shapes, /*is_output=*/false);
  node->starts = SavedVariable(level_start_index, /*is_output=*/false);
  node->loc = SavedVariable(sampling_locations, /*is_output=*/false);
  node->attn = SavedVariable(attention_weights, /*is_output=*/false);
  node->options = options.vec();
  torch::autograd::set_history(out, node);
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(npudet, CPU, m) {
  m.impl("msda_cpu_forward", &forward_cpu);
  m.impl("msda_cpu_backward", &backward_cpu);
}

TORCH_LIBRARY_IMPL(npudet, Autograd, m) { m.impl("msda_cpu_forward", &forward_autograd); }
