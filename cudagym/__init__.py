"""cudagym: fused-operator CUDA tasks, hack-resistant KernelBench evaluation, agents and training."""

__version__ = "0.1.0"
