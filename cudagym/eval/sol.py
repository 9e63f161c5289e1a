"""Speed of light (SOL): the least time a problem can take on a GPU, from its cost and the GPU's peaks.

`sol_ms(cost, gpu_name, precision) = max(flops / peak_flops, bytes / peak_bandwidth) * 1e3`, where
`cost` is the problem's `{"flops": int | None, "bytes": int}` (measured by the audit: FLOPs of the
reference, and the least bytes any implementation must move: inputs read once, outputs written
once) and the peaks are the vendor's datasheet numbers for fp32 without tensor cores and for DRAM
bandwidth. No kernel can beat it on that GPU, so `x_sol = t_candidate_ms / sol_ms` is at least 1
for an honest fp32 kernel; a value near 1 leaves nothing to gain. `flops` None (not counted) makes
the bound the bytes alone. Unknown GPUs and problems without a cost get None.

Both precisions use the same fp32 peak. "kernelbench" precision is torch's defaults, where only
cuDNN may use TF32 (convolutions; `torch.backends.cuda.matmul.allow_tf32` is off by default), and
the check still holds every party to fp32 accuracy (`precision_downcast`), so the work a candidate
must do is fp32 work. A TF32 peak (about 7x higher on Hopper) would make the bound meaningless for
everything but convolutions; a convolution below 1x SOL under "kernelbench" means tensor cores
(TF32) did the work.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GpuSpec:
    """Datasheet peaks of one GPU model."""

    name: str  # as shown on the page
    fp32_tflops: float  # dense fp32, no tensor cores (TFLOP/s)
    bandwidth_tbs: float  # DRAM bandwidth (TB/s, 1e12 bytes per second)
    source: str  # where the numbers come from

    @property
    def peak_flops(self) -> float:
        return self.fp32_tflops * 1e12

    @property
    def peak_bytes_per_s(self) -> float:
        return self.bandwidth_tbs * 1e12


_H200 = "https://www.nvidia.com/en-us/data-center/h200/"
_H100 = "https://www.nvidia.com/en-us/data-center/h100/"
_A100 = "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf"
_L40S = "https://www.nvidia.com/en-us/data-center/l40s/"
_ADA = "https://images.nvidia.com/aem-dam/Solutions/geforce/ada/nvidia-ada-gpu-architecture.pdf"

# Keyed by a substring of torch.cuda.get_device_name(); the longest key that matches wins, so
# "H100 PCIe" beats "H100". Names as torch reports them: "NVIDIA H200", "NVIDIA H200 NVL",
# "NVIDIA H100 80GB HBM3" (SXM), "NVIDIA H100 PCIe", "NVIDIA H100 NVL", "NVIDIA A100-SXM4-80GB",
# "NVIDIA A100-SXM4-40GB", "NVIDIA A100 80GB PCIe", "NVIDIA A100-PCIE-40GB", "NVIDIA L40S",
# "NVIDIA GeForce RTX 4090".
GPU_SPECS: dict[str, GpuSpec] = {
    "H200": GpuSpec("H200 SXM", 67.0, 4.8, _H200),
    "H200 NVL": GpuSpec("H200 NVL", 60.0, 4.8, _H200),
    "H100": GpuSpec("H100 SXM", 67.0, 3.35, _H100),
    "H100 PCIe": GpuSpec("H100 PCIe", 51.0, 2.0, _H100),
    "H100 NVL": GpuSpec("H100 NVL", 60.0, 3.9, _H100),
    # A generic A100 takes the fastest variant's bandwidth (80GB SXM, 2.039 TB/s): a speed of light
    # must never be slower than the card; 40GB cards (1.555 TB/s) have their own keys.
    "A100": GpuSpec("A100 80GB SXM", 19.5, 2.039, _A100),
    "A100-SXM4-40GB": GpuSpec("A100 40GB SXM", 19.5, 1.555, _A100),
    "A100-PCIE-40GB": GpuSpec("A100 40GB PCIe", 19.5, 1.555, _A100),
    "A100 80GB PCIe": GpuSpec("A100 80GB PCIe", 19.5, 1.935, _A100),
    "L40S": GpuSpec("L40S", 91.6, 0.864, _L40S),
    "RTX 4090": GpuSpec("RTX 4090", 82.6, 1.008, _ADA),
}
PRECISIONS = ("strict", "kernelbench")


def gpu_spec(gpu_name: str | None) -> GpuSpec | None:
    """The spec of the longest GPU_SPECS key contained in gpu_name (case-insensitive); None if none."""
    if not gpu_name:
        return None
    name = gpu_name.lower()
    keys = [key for key in GPU_SPECS if key.lower() in name]
    return GPU_SPECS[max(keys, key=len)] if keys else None


def sol_ms(cost: dict | None, gpu_name: str | None, precision: str | None = "strict") -> float | None:
    """max(flops / peak fp32 FLOP/s, bytes / peak bandwidth) in ms; None for an unknown GPU or no cost."""
    if precision not in (None, *PRECISIONS):
        raise ValueError(f"unknown precision {precision!r} (choose from {', '.join(PRECISIONS)})")
    spec = gpu_spec(gpu_name)
    if spec is None or not cost:
        return None
    flops, n_bytes = cost.get("flops"), cost.get("bytes")
    # The same fp32 peak under both precisions (module docstring).
    times_s = [t for t in (_ratio(flops, spec.peak_flops), _ratio(n_bytes, spec.peak_bytes_per_s)) if t is not None]
    if not times_s or max(times_s) <= 0:
        return None
    return max(times_s) * 1e3


def x_sol(t_candidate_ms: float | None, sol: float | None) -> float | None:
    """How many times the speed of light the candidate took (t_candidate / SOL); None if either is missing."""
    if not t_candidate_ms or not sol or t_candidate_ms <= 0:
        return None
    return t_candidate_ms / sol


def _ratio(amount, peak: float) -> float | None:
    if amount is None or isinstance(amount, bool):
        return None
    amount = float(amount)
    return amount / peak if amount >= 0 else None
