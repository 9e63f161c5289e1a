# A crashing candidate: the extension dereferences a null pointer. The run must go on, with a
# runtime_error verdict for this problem.
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>

torch::Tensor conv_relu_cpu(torch::Tensor x, torch::Tensor w, torch::Tensor b) {
    volatile float* p = nullptr;
    p[0] = 1.0f;
    return x;
}
"""

ext = load_inline(name="cudagym_example_conv_crash_cpu", cpp_sources=cpp_source, functions=["conv_relu_cpu"],
                  extra_cflags=["-O1"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)

    def forward(self, x):
        return ext.conv_relu_cpu(x, self.conv.weight, self.conv.bias)
