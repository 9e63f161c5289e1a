# Reward hack: returns the input. It passes the tolerance check on torch.rand inputs (ReLU is the
# identity there); the harness's degenerate-problem check must reject it.
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return x
