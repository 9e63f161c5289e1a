"""Speed of light: every expected number below is worked out by hand from the datasheet peaks."""

from __future__ import annotations

import pytest

from cudagym.eval.sol import gpu_spec, sol_ms, x_sol

# 1024^3 fp32 matmul: 2 * 1024^3 FLOPs; reads A and B, writes C: 3 * 1024^2 * 4 bytes
MATMUL = {"flops": 2 * 1024**3, "bytes": 3 * 1024**2 * 4}
# ReLU of 16M fp32: one op per element, reads and writes 16M * 4 bytes
RELU = {"flops": 16 * 2**20, "bytes": 2 * 16 * 2**20 * 4}


def test_compute_bound_matmul_on_h200():
    # compute 2147483648 / 67e12 = 3.2052e-5 s; memory 12582912 / 4.8e12 = 2.6214e-6 s -> 0.032052 ms
    assert sol_ms(MATMUL, "NVIDIA H200", "strict") == pytest.approx(2 * 1024**3 / 67e12 * 1e3)
    assert sol_ms(MATMUL, "NVIDIA H200", "strict") == pytest.approx(0.0320520, rel=1e-5)


def test_memory_bound_relu_on_h200_h100_and_a100():
    # memory 134217728 / 4.8e12 = 2.7962e-5 s (compute 16777216 / 67e12 = 2.5e-7 s is smaller)
    assert sol_ms(RELU, "NVIDIA H200", "strict") == pytest.approx(0.0279620, rel=1e-5)
    # H100 SXM (torch: "NVIDIA H100 80GB HBM3"): 134217728 / 3.35e12 = 4.0065e-5 s
    assert sol_ms(RELU, "NVIDIA H100 80GB HBM3", "strict") == pytest.approx(0.0400650, rel=1e-5)
    # H100 PCIe: 2.0 TB/s (the longer key wins over "H100") -> 6.7109e-5 s
    assert sol_ms(RELU, "NVIDIA H100 PCIe", "strict") == pytest.approx(0.0671089, rel=1e-5)
    # A100 80GB SXM 2.039 TB/s -> 6.5825e-5 s; A100 40GB 1.555 TB/s -> 8.6314e-5 s
    assert sol_ms(RELU, "NVIDIA A100-SXM4-80GB", "strict") == pytest.approx(0.0658253, rel=1e-5)
    assert sol_ms(RELU, "NVIDIA A100-SXM4-40GB", "strict") == pytest.approx(0.0863137, rel=1e-5)


def test_kernelbench_precision_uses_the_same_fp32_peak():
    assert sol_ms(MATMUL, "NVIDIA H200", "kernelbench") == sol_ms(MATMUL, "NVIDIA H200", "strict")
    with pytest.raises(ValueError, match="precision"):
        sol_ms(MATMUL, "NVIDIA H200", "fp8")


def test_unknown_gpu_or_missing_cost_gives_none():
    assert sol_ms(MATMUL, "NVIDIA GeForce GTX 1080", "strict") is None
    assert sol_ms(MATMUL, None, "strict") is None
    assert sol_ms(None, "NVIDIA H200", "strict") is None
    assert sol_ms({}, "NVIDIA H200", "strict") is None
    assert sol_ms({"flops": None, "bytes": None}, "NVIDIA H200", "strict") is None


def test_flops_not_counted_leaves_the_bytes_bound():
    # 4.8e9 bytes on 4.8 TB/s: exactly 1 ms
    assert sol_ms({"flops": None, "bytes": 4_800_000_000}, "NVIDIA H200", "strict") == pytest.approx(1.0)


def test_gpu_spec_matches_by_substring_longest_first():
    assert gpu_spec("NVIDIA H200").name == "H200 SXM"
    assert gpu_spec("NVIDIA H200 NVL").name == "H200 NVL"
    assert gpu_spec("nvidia h100 nvl").bandwidth_tbs == 3.9
    assert gpu_spec("NVIDIA GeForce RTX 4090").fp32_tflops == 82.6
    assert gpu_spec("") is None


def test_x_sol():
    sol = sol_ms(MATMUL, "NVIDIA H200", "strict")
    # 0.5 ms / 0.032052 ms = 15.6
    assert x_sol(0.5, sol) == pytest.approx(15.5998, rel=1e-4)
    assert x_sol(None, sol) is None and x_sol(0.5, None) is None
