import torch
import torch.nn as nn


class Model(nn.Module):
    """C = diag(A) @ B (KernelBench L1/12 in miniature): row scaling in disguise."""

    def __init__(self):
        super().__init__()

    def forward(self, A, B):
        return torch.diag(A) @ B


N, M = 512, 256


def get_inputs():
    return [torch.randn(N), torch.randn(N, M)]


def get_init_inputs():
    return []
