import torch
import torch.nn as nn

class Model(nn.Module):
    """
    A small elementwise task (a stand-in for the stress benchmark's own problems): out = x * 3 + 1.
    """
    def __init__(self):
        super(Model, self).__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 3.0 + 1.0

batch_size = 64
dim = 4096

def get_inputs():
    return [torch.randn(batch_size, dim)]

def get_init_inputs():
    return []
