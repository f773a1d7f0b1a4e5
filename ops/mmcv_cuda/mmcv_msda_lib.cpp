// mmcv 2.1.0's MSDA CUDA kernel as torch operators, with no Python in between.
//
// Built by npudet/ops/msda/backends/mmcv_cuda_lib.py together with mmcv's own
// pytorch/cuda/ms_deform_attn_cuda.cu, taken from mmcv's source distribution at
// build time (never kept in this repository). The library registers its operators
// with TORCH_LIBRARY, so it links against libtorch only (no Python ABI) and is loaded
// with torch.ops.load_library: torch.ops.npudet_mmcv.ms_deform_attn_{forward,backward}.
// It replaces mmcv's device registry and pybind layer, which would need all of mmcv._ext.

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <tuple>

// Defined in mmcv's ms_deform_attn_cuda.cu.
at::Tensor ms_deform_attn_cuda_forward(const at::Tensor &value,
                                       const at::Tensor &spatial_shapes,
                                       const at::Tensor &level_start_index,
                                       const at::Tensor &sampling_loc,
                                       const at::Tensor &attn_weight,
                                       const int im2col_step);

void ms_deform_attn_cuda_backward(
    const at::Tensor &value, const at::Tensor &spatial_shapes,
    const at::Tensor &level_start_index, const at::Tensor &sampling_loc,
    const at::Tensor &attn_weight, const at::Tensor &grad_output,
    at::Tensor &grad_value, at::Tensor &grad_sampling_loc,
    at::Tensor &grad_attn_weight, const int im2col_step);

namespace {

// value (bs, keys, heads, D), spatial_shapes (levels, 2) int64, level_start_index
// (levels,) int64, sampling_loc (bs, queries, heads, levels, points, 2), attn_weight
// (bs, queries, heads, levels, points) -> (bs, queries, heads * D). All contiguous,
// on one CUDA device, value's dtype (mmcv checks contiguity and device itself).
at::Tensor forward(const at::Tensor &value, const at::Tensor &spatial_shapes,
                   const at::Tensor &level_start_index,
                   const at::Tensor &sampling_loc, const at::Tensor &attn_weight,
                   int64_t im2col_step) {
  // mmcv launches on the current stream of the current device: make it value's.
  const c10::cuda::CUDAGuard guard(value.device());
  return ms_deform_attn_cuda_forward(value, spatial_shapes, level_start_index,
                                     sampling_loc, attn_weight,
                                     static_cast<int>(im2col_step));
}

// The gradients of value, sampling_loc and attn_weight. mmcv's kernel adds into
// them (atomicAdd), so they start as zeros, as mmcv's own autograd.Function makes them.
std::tuple<at::Tensor, at::Tensor, at::Tensor> backward(
    const at::Tensor &value, const at::Tensor &spatial_shapes,
    const at::Tensor &level_start_index, const at::Tensor &sampling_loc,
    const at::Tensor &attn_weight, const at::Tensor &grad_output,
    int64_t im2col_step) {
  const c10::cuda::CUDAGuard guard(value.device());
  at::Tensor grad_value = at::zeros_like(value);
  at::Tensor grad_sampling_loc = at::zeros_like(sampling_loc);
  at::Tensor grad_attn_weight = at::zeros_like(attn_weight);
  ms_deform_attn_cuda_backward(value, spatial_shapes, level_start_index,
                               sampling_loc, attn_weight, grad_output.contiguous(),
                               grad_value, grad_sampling_loc, grad_attn_weight,
                               static_cast<int>(im2col_step));
  return {grad_value, grad_sampling_loc, grad_attn_weight};
}

}  // namespace

TORCH_LIBRARY(npudet_mmcv, m) {
  m.def(
      "ms_deform_attn_forward(Tensor value, Tensor spatial_shapes, "
      "Tensor level_start_index, Tensor sampling_loc, Tensor attn_weight, "
      "int im2col_step) -> Tensor");
  m.def(
      "ms_deform_attn_backward(Tensor value, Tensor spatial_shapes, "
      "Tensor level_start_index, Tensor sampling_loc, Tensor attn_weight, "
      "Tensor grad_output, int im2col_step) -> (Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(npudet_mmcv, CUDA, m) {
  m.impl("ms_deform_attn_forward", &forward);
  m.impl("ms_deform_attn_backward", &backward);
}
