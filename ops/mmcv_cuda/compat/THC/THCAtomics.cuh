// Stand-in for the THC header mmcv 2.1.0's ms_deform_attn_cuda.cu includes, which newer
// torch releases no longer ship: its atomicAdd overloads (at::Half, double, ...) are in
// ATen/cuda/Atomic.cuh. Put on the include path only when torch lacks the header.
#pragma once
#include <ATen/cuda/Atomic.cuh>
