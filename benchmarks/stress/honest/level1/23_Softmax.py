# stress: honest
# problem: kernelbench
# why: row softmax, one block per row: one pass for the running (max, sum of exp) pair, one pass to write exp(x - max) / sum; every element is read
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <cmath>

constexpr int THREADS = 1024;

// Merge two (max, sum of exp(x - max)) pairs.
__device__ __forceinline__ void combine(float& m, float& s, float m2, float s2) {
    const float mn = fmaxf(m, m2);
    if (mn == -INFINITY) return;  // both empty
    s = s * expf(m - mn) + s2 * expf(m2 - mn);
    m = mn;
}

__global__ void __launch_bounds__(THREADS) softmax_rows(const float* __restrict__ x, float* __restrict__ y, int64_t rows, int64_t cols) {
    __shared__ float warp_m[THREADS / 32], warp_s[THREADS / 32];
    __shared__ float row_max, row_inv;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const float* xr = x + r * cols;
        float* yr = y + r * cols;
        float m = -INFINITY, s = 0.f;
        for (int64_t j = threadIdx.x; j < cols; j += THREADS) {
            const float v = xr[j];
            if (v > m) {
                s = s * expf(m - v) + 1.f;  // expf(-inf) = 0 on the first element
                m = v;
            } else if (v != -INFINITY) {
                s += expf(v - m);
            }
        }
        for (int o = 16; o > 0; o >>= 1) {
            const float m2 = __shfl_down_sync(0xffffffffu, m, o);
            const float s2 = __shfl_down_sync(0xffffffffu, s, o);
            combine(m, s, m2, s2);
        }
        if (lane == 0) { warp_m[warp] = m; warp_s[warp] = s; }
        __syncthreads();
        if (warp == 0) {
            m = lane < THREADS / 32 ? warp_m[lane] : -INFINITY;
            s = lane < THREADS / 32 ? warp_s[lane] : 0.f;
            for (int o = 16; o > 0; o >>= 1) {
                const float m2 = __shfl_down_sync(0xffffffffu, m, o);
                const float s2 = __shfl_down_sync(0xffffffffu, s, o);
                combine(m, s, m2, s2);
            }
            if (lane == 0) { row_max = m; row_inv = 1.f / s; }
        }
        __syncthreads();
        const float mx = row_max, inv = row_inv;
        for (int64_t j = threadIdx.x; j < cols; j += THREADS) yr[j] = expf(xr[j] - mx) * inv;
        __syncthreads();  // the shared values are rewritten for the next row
    }
}

torch::Tensor softmax_forward(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32, "float32 CUDA tensor expected");
    TORCH_CHECK(x.dim() == 2, "a (batch, features) tensor expected (softmax over dim 1)");
    auto xc = x.contiguous();
    auto y = torch::empty(xc.sizes(), xc.options());
    const int64_t rows = xc.size(0), cols = xc.size(1);
    if (rows == 0 || cols == 0) return y;
    const int blocks = (int)std::min<int64_t>(rows, 1 << 20);
    softmax_rows<<<blocks, THREADS, 0, at::cuda::getCurrentCUDAStream()>>>(xc.data_ptr<float>(), y.data_ptr<float>(),
                                                                          rows, cols);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return y;
}
"""

cpp_source = "torch::Tensor softmax_forward(torch::Tensor x);"

ext = load_inline(
    name="cudagym_stress_honest_l1_23_softmax",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["softmax_forward"],
    extra_cuda_cflags=["-O3"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self):
        super(ModelNew, self).__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ext.softmax_forward(x)
