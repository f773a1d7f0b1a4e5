// Autograd of the npudet::msda_cpu_* operators (msda_cpu_ops.cpp defines them), a library
// of its own: it is written against torch's internal autograd headers, which change between
// releases, and if it fails to build npudet.ops.msda.backends.cpu registers a Python autograd
// kernel instead (slower host path, same results) and the kernels keep serving.
//
// The backward node is written as ATen's generated ones are (a Node with its saved
// variables), not as a torch::autograd::Function: measured on a 1-query call, the
// custom-function node cost 13 us more per forward+backward (65 vs 78 us; one ATen op with
// autograd: 40 us). As ATen does for an op without a formula, forward-mode AD raises and a
// gradient computed with create_graph=True gets a node that raises when differentiated.
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/autograd.h>
#include <torch/csrc/autograd/functions/basic_ops.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/library.h>

#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace {

using torch::autograd::SavedVariable;
using torch::autograd::variable_list;

using Tensors3 = std::tuple<at::Tensor, at::Tensor, at::Tensor>;
using ForwardFn = at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                             const at::Tensor&, const at::Tensor&, at::IntArrayRef);
using BackwardFn = Tensors3(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                            const at::Tensor&, const at::Tensor&, const at::Tensor&,
                            at::IntArrayRef);

const c10::TypedOperatorHandle<ForwardFn>& forward_op() {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("npudet::msda_cpu_forward", "")
                             .typed<ForwardFn>();
  return op;
}

const c10::TypedOperatorHandle<BackwardFn>& backward_op() {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("npudet::msda_cpu_backward", "")
                             .typed<BackwardFn>();
  return op;
}

// The error ATen's generated code raises for an op with no forward-mode formula: a dual
// tensor's tangent must never be dropped silently.
template <typename... Ts>
void check_no_forward_grad(const char* op, const Ts&... tensors) {
  TORCH_CHECK(!(torch::autograd::isFwGradDefined(tensors) || ...),
              "Trying to use forward AD with ", op,
              " that does not support it: npudet's cpu MSDA has no forward-mode formula; "
              "use impl='grid_sample' for torch.func.jvp / forward-mode AD");
}

// torch >= 2.13 holds autograd nodes in c10::intrusive_ptr; earlier releases in shared_ptr
// with torch::autograd::deleteNode (found by argument-dependent lookup through Node), which
// frees a long graph without deep recursion.
template <typename T, typename... Args>
auto make_node(Args&&... args) {
  if constexpr (std::is_base_of_v<c10::intrusive_ptr_target, T>) {
    return c10::make_intrusive<T>(std::forward<Args>(args)...);
  } else {
    return std::shared_ptr<T>(new T(std::forward<Args>(args)...),
                              [](T* node) { deleteNode(node); });
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
  check_no_forward_grad("npudet::msda_cpu_forward", value, sampling_locations, attention_weights);
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

// The gradients are not differentiable again: with create_graph=True they get ATen's
// NotImplemented node, which raises "derivative for npudet::msda_cpu_backward is not
// implemented" when a second-order gradient is asked for.
Tensors3 backward_autograd(const at::Tensor& grad_output, const at::Tensor& value,
                           const at::Tensor& spatial_shapes, const at::Tensor& level_start_index,
                           const at::Tensor& sampling_locations,
                           const at::Tensor& attention_weights, at::IntArrayRef options) {
  check_no_forward_grad("npudet::msda_cpu_backward", grad_output, value, sampling_locations,
                        attention_weights);
  Tensors3 grads;
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    grads = backward_op().call(grad_output, value, spatial_shapes, level_start_index,
                               sampling_locations, attention_weights, options);
  }
  if (torch::autograd::compute_requires_grad(grad_output, value, sampling_locations,
                                             attention_weights)) {
    auto node = make_node<torch::autograd::NotImplemented>("npudet::msda_cpu_backward");
    node->set_next_edges(torch::autograd::collect_next_edges(grad_output, value,
                                                             sampling_locations,
                                                             attention_weights));
    torch::autograd::set_history(std::get<0>(grads), node);
    torch::autograd::set_history(std::get<1>(grads), node);
    torch::autograd::set_history(std::get<2>(grads), node);
  }
  return grads;
}

}  // namespace

TORCH_LIBRARY_IMPL(npudet, Autograd, m) {
  m.impl("msda_cpu_forward", &forward_autograd);
  m.impl("msda_cpu_backward", &backward_autograd);
}
