// The fused CPU MSDA kernels (msda_cpu.cpp), float32 / float64, inputs of value's dtype.
// msda_cpu_op.cpp registers them as the torch ops npudet::msda_cpu_forward / _backward.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace npudet {

// (B, K, NH, D) value, (L, 2) spatial_shapes, (L,) level_start_index,
// (B, Q, NH, L, P, 2) sampling_locations, (B, Q, NH, L, P) attention_weights
// -> (B, Q, NH * D). `options` is CPUKernelOptions.as_ints().
at::Tensor msda_forward(const at::Tensor& value, const at::Tensor& spatial_shapes,
                        const at::Tensor& level_start_index, const at::Tensor& sampling_locations,
                        const at::Tensor& attention_weights, const std::vector<int64_t>& options);

// grad_output (B, Q, NH * D) -> {grad value, grad sampling_locations, grad attention_weights}.
std::vector<at::Tensor> msda_backward(const at::Tensor& grad_output, const at::Tensor& value,
                                      const at::Tensor& spatial_shapes,
                                      const at::Tensor& level_start_index,
                                      const at::Tensor& sampling_locations,
                                      const at::Tensor& attention_weights,
                                      const std::vector<int64_t>& options);

}  // namespace npudet
