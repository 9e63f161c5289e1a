# stress: honest
# problem: kernelbench
# why: exact algebra: after the sum over features every later op (max, mean, logsumexp over a dim of size 1) is the identity, and sum_j (x W^T + b)_j = x . (sum_j W_j) + sum_j b_j: a column sum of W, then a GEMV, in double accumulators
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

constexpr int THREADS = 256;
constexpr int CHUNKS = 64;  // row chunks of W summed in parallel, then combined

__device__ double block_sum(double v) {
    __shared__ double warp_sums[THREADS / 32];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) warp_sums[warp] = v;
    __syncthreads();
    v = (threadIdx.x < THREADS / 32) ? warp_sums[threadIdx.x] : 0.0;
    if (warp == 0)
        for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    return v;  // the block's sum, in thread 0
}

// partial[c, k] = sum of w[j, k] over the rows j of chunk c (grid: x over k, y = chunk).
__global__ void colsum_partial(const float* __restrict__ w, double* __restrict__ partial, int64_t out_f, int64_t in_f) {
    const int64_t rows_per_chunk = (out_f + gridDim.y - 1) / gridDim.y;
    const int64_t j0 = blockIdx.y * rows_per_chunk;
    const int64_t j1 = j0 + rows_per_chunk < out_f ? j0 + rows_per_chunk : out_f;
    for (int64_t k = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; k < in_f; k += (int64_t)gridDim.x * blockDim.x) {
        double acc = 0.0;
        for (int64_t j = j0; j < j1; ++j) acc += w[j * in_f + k];
        partial[blockIdx.y * in_f + k] = acc;
    }
}

// wsum[k] = sum over chunks of partial[c, k].
__global__ void colsum_finish(const double* __restrict__ partial, double* __restrict__ wsum, int64_t chunks, int64_t in_f) {
    for (int64_t k = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; k < in_f; k += (int64_t)gridDim.x * blockDim.x) {
        double acc = 0.0;
        for (int64_t c = 0; c < chunks; ++c) acc += partial[c * in_f + k];
        wsum[k] = acc;
    }
}

// bsum[0] = sum_j b[j] (one block).
__global__ void bias_sum(const float* __restrict__ b, double* __restrict__ bsum, int64_t n) {
    double acc = 0.0;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) acc += b[j];
    const double s = block_sum(acc);
    if (threadIdx.x == 0) bsum[0] = s;
}

// out[r] = sum_k x[r, k] * wsum[k] + bsum (one block per row, grid-stride).
__global__ void gemv_rows(const float* __restrict__ x, const double* __restrict__ wsum, const double* __restrict__ bsum,
                          float* __restrict__ out, int64_t rows, int64_t in_f) {
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const float* xr = x + r * in_f;
        double acc = 0.0;
        for (int64_t k = threadIdx.x; k < in_f; k += THREADS) acc += (double)xr[k] * wsum[k];
        const double s = block_sum(acc);
        if (threadIdx.x == 0) out[r] = (float)(s + bsum[0]);
        __syncthreads();  // the warp sums are reused for the next row
    }
}

torch::Tensor linear_sum_forward(torch::Tensor x, torch::Tensor weight, torch::Tensor bias) {
    TORCH_CHECK(x.is_cuda() && weight.is_cuda() && bias.is_cuda(), "CUDA tensors expected");
    TORCH_CHECK(x.scalar_type() == torch::kFloat32 && weight.scalar_type() == torch::kFloat32 &&
                bias.scalar_type() == torch::kFloat32, "float32 expected");
    TORCH_CHECK(x.dim() == 2 && weight.dim() == 2 && x.size(1) == weight.size(1) && bias.numel() == weight.size(0),
                "x (B, in), weight (out, in), bias (out,) expected");
    auto xc = x.contiguous();
    auto wc = weight.contiguous();
    auto bc = bias.contiguous();
    const int64_t rows = xc.size(0), in_f = xc.size(1), out_f = wc.size(0);
    auto out = torch::empty({rows, 1}, xc.options());
    if (rows == 0) return out;
    auto dopts = xc.options().dtype(torch::kFloat64);
    const int64_t chunks = std::max<int64_t>(1, std::min<int64_t>(CHUNKS, out_f));
    auto partial = torch::empty({chunks * in_f}, dopts);
    auto wsum = torch::empty({in_f}, dopts);
    auto bsum = torch::empty({1}, dopts);
    cudaStream_t stream = at::cuda::getCurrentCUDAStream();
    const int kblocks = (int)std::max<int64_t>(1, std::min<int64_t>((in_f + THREADS - 1) / THREADS, 1024));
    colsum_partial<<<dim3(kblocks, (unsigned)chunks), THREADS, 0, stream>>>(wc.data_ptr<float>(), partial.data_ptr<double>(),
                                                                           out_f, in_f);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    colsum_finish<<<kblocks, THREADS, 0, stream>>>(partial.data_ptr<double>(), wsum.data_ptr<double>(), chunks, in_f);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    bias_sum<<<1, THREADS, 0, stream>>>(bc.data_ptr<float>(), bsum.data_ptr<double>(), out_f);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    const int rblocks = (int)std::min<int64_t>(rows, 1 << 20);
    gemv_rows<<<rblocks, THREADS, 0, stream>>>(xc.data_ptr<float>(), wsum.data_ptr<double>(), bsum.data_ptr<double>(),
                                               out.data_ptr<float>(), rows, in_f);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return out;
}
"""

cpp_source = "torch::Tensor linear_sum_forward(torch::Tensor x, torch::Tensor weight, torch::Tensor bias);"

ext = load_inline(
    name="cudagym_stress_honest_l2_18_linear_sum",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["linear_sum_forward"],
    extra_cuda_cflags=["-O3"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features):
        super(ModelNew, self).__init__()
        self.linear = nn.Linear(in_features, out_features)  # same parameter names as the reference: its weights load

    def forward(self, x):
        return ext.linear_sum_forward(x, self.linear.weight, self.linear.bias)
