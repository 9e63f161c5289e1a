import torch
import torch.nn as nn


class Model(nn.Module):
    """y = relu(x W^T + b) * scale."""

    def __init__(self, in_features, out_features, scale):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.scale = scale

    def forward(self, x):
        return torch.relu(self.linear(x)) * self.scale


def get_inputs():
    return [torch.randn(32, 128)]


def get_init_inputs():
    return [128, 64, 0.5]
