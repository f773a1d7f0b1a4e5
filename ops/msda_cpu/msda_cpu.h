// The fused CPU MSDA kernels (msda_cpu.cpp): float32 / float64, inputs of value's dtype.
// msda_cpu_ops.cpp registers them as the torch ops npudet::msda_cpu_forward / _backward and
// the tools' probes as npudet::_msda_cpu_*. Nothing here includes Python.
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

// How many ints `options` holds (CPUKernelOptions.as_ints() must agree).
int64_t num_options();

// The backward strategy `options` resolves to for these sizes on this process's threads:
// {strategy (0 private copies, 1 ownership, 2 atomic), ownership chunks, bytes of private
// grad_value copies}. For tests and tools.
std::vector<int64_t> backward_plan(int64_t B, int64_t K, int64_t NH, int64_t D, int64_t Q,
                                   int64_t elem_bytes, const std::vector<int64_t>& options);

// Gather-only probe for the benchmark: out[r] = the sum over samples i of the in-map corner
// rows of rows[top_left[r, i]] (corner j is delta[j] = {0, x_step, row_step[i],
// row_step[i] + x_step} rows after it; bit j of corners[r, i] says it is in the map), rows r
// in parallel with grain `grain`, the next r's rows prefetched as the kernel prefetches its
// next row's corners. The loads of the forward with nothing else computed: its time is the
// machine's row-load limit for that access pattern.
at::Tensor gather_probe(const at::Tensor& rows, const at::Tensor& top_left,
                        const at::Tensor& corners, const at::Tensor& row_step, int64_t x_step,
                        int64_t grain);

}  // namespace npudet
