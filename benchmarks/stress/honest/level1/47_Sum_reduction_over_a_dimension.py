# stress: honest
# problem: kernelbench
# kb_version: v0
# why: sum over one dim (keepdim): one thread per (outer, inner) output, a strided loop over the reduced dim (coalesced across inner), double accumulator; a tiny problem (KernelBench v0 sizes)
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <vector>

// x viewed as (outer, R, inner); out[o, 0, i] = sum_r x[o, r, i].
__global__ void sum_dim_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t outer, int64_t R,
                               int64_t inner) {
    const int64_t total = outer * inner;
    for (int64_t p = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; p < total; p += (int64_t)gridDim.x * blockDim.x) {
        const int64_t o = p / inner, i = p - o * inner;
        const float* xp = x + o * R * inner + i;
        double acc = 0.0;
        for (int64_t r = 0; r < R; ++r) acc += xp[r * inner];
        y[p] = (float)acc;
    }
}

torch::Tensor sum_dim_forward(torch::Tensor x, int64_t dim) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32, "float32 CUDA tensor expected");
    TORCH_CHECK(x.dim() >= 1, "at least one dim expected");
    if (dim < 0) dim += x.dim();
    TORCH_CHECK(dim >= 0 && dim < x.dim(), "dim out of range");
    auto xc = x.contiguous();
    std::vector<int64_t> out_sizes(xc.sizes().begin(), xc.sizes().end());
    out_sizes[dim] = 1;
    auto y = torch::empty(out_sizes, xc.options());
    int64_t outer = 1, inner = 1;
    for (int64_t d = 0; d < dim; ++d) outer *= xc.size(d);
    for (int64_t d = dim + 1; d < xc.dim(); ++d) inner *= xc.size(d);
    const int64_t R = xc.size(dim);
    const int64_t total = outer * inner;
    if (total == 0) return y;
    const int threads = 256;
    const int64_t max_blocks = (int64_t)at::cuda::getCurrentDeviceProperties()->multiProcessorCount * 16;
    const int blocks = (int)std::min<int64_t>((total + threads - 1) / threads, max_blocks);
    sum_dim_kernel<<<blocks, threads, 0, at::cuda::getCurrentCUDAStream()>>>(xc.data_ptr<float>(), y.data_ptr<float>(),
                                                                            outer, R, inner);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return y;
}
"""

cpp_source = "torch::Tensor sum_dim_forward(torch::Tensor x, int64_t dim);"

ext = load_inline(
    name="cudagym_stress_honest_v0_l1_47_sum_dim",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["sum_dim_forward"],
    extra_cuda_cflags=["-O3"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super(ModelNew, self).__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ext.sum_dim_forward(x, self.dim)
