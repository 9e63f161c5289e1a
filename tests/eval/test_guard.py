"""Runtime op guard: Python-level torch compute is forbidden under strict, allocation and views are
not; low-precision arithmetic in an fp32 task is a downcast under every policy."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from cudagym.eval.guard import POLICIES, OpRecord, make_guard, short_name

FP32 = {"float32"}


def record_of(fn) -> OpRecord:
    record = OpRecord()
    with torch.no_grad():
        with make_guard(record):
            fn()
    return record


@pytest.fixture(scope="module")
def xy():
    torch.manual_seed(0)
    return torch.randn(8, 8), torch.randn(8, 8)


@pytest.fixture(scope="module")
def linear():
    return torch.nn.Linear(8, 8)


COMPUTE = {
    "torch.matmul": lambda x, y, lin: torch.matmul(x, y),
    "x @ y": lambda x, y, lin: x @ y,
    "F.relu": lambda x, y, lin: F.relu(x),
    "x.exp()": lambda x, y, lin: x.exp(),
    "getattr(torch, 'mm')": lambda x, y, lin: getattr(torch, "mm")(x, y),
    "nn.Linear": lambda x, y, lin: lin(x),
    # Judged by the C++ allowance (the static checks catch Python naming torch.ops.aten); exp is in neither.
    "torch.ops.aten.exp": lambda x, y, lin: torch.ops.aten.exp(x),
}


@pytest.mark.parametrize("name", COMPUTE)
def test_python_compute_forbidden_under_strict_only(name, xy, linear):
    x, y = xy
    record = record_of(lambda: COMPUTE[name](x, y, linear))
    strict = record.violations("strict", FP32)
    assert "forbidden_op" in strict and strict["forbidden_op"]
    assert all(op.startswith(("py:", "c++:")) for op in strict["forbidden_op"])
    assert record.violations("permissive", FP32) == {}


def test_matmul_details_name_the_op(xy):
    x, y = xy
    bad = record_of(lambda: torch.matmul(x, y)).violations("strict", FP32)["forbidden_op"]
    assert "py:torch.matmul" in bad
    assert any(short_name(op[3:]) == "mm" for op in bad)


def test_allocation_and_views_are_allowed(xy):
    x, _ = xy

    def layout_only():
        torch.empty_like(x)
        x.view(-1)
        x.t()
        x.contiguous()
        x.t().contiguous()  # a real copy
        x.reshape(4, 16)
        assert x.shape == (8, 8)
        torch.zeros(3)

    record = record_of(layout_only)
    assert record.python_calls  # the calls were seen, and all judged allowed
    for policy in POLICIES:
        assert record.violations(policy, FP32) == {}


def test_half_arithmetic_is_downcast_under_every_policy(xy):
    x, _ = xy
    record = record_of(lambda: x.half() + 1)
    assert "float16" in record.dtypes
    for policy in ("strict", "permissive"):
        assert record.violations(policy, FP32)["precision_downcast"] == ["float16"]
    assert "precision_downcast" not in record.violations("permissive", FP32 | {"float16"})
    assert "precision_downcast" not in record.violations("strict", FP32 | {"float16"})


def test_bfloat16_is_downcast(xy):
    x, y = xy
    record = record_of(lambda: x.bfloat16() @ y.bfloat16())
    assert record.violations("permissive", FP32) == {"precision_downcast": ["bfloat16"]}


def test_fp32_compute_has_no_precision_flag(xy):
    x, y = xy
    assert "precision_downcast" not in record_of(lambda: (x @ y).relu()).violations("strict", FP32)


def test_nothing_recorded_outside_the_guard(xy):
    x, y = xy
    record = OpRecord()
    guard = make_guard(record)
    with guard:
        pass
    torch.matmul(x, y)
    assert not record.python_calls and not record.python_aten and not record.cpp_aten


def test_cpp_side_gemm_allowed_but_other_aten_not():
    # What compiled code issues (no Python-level torch call open) is judged by the C++ allowance.
    record = OpRecord(cpp_aten={"aten::mm", "aten::convolution", "aten::empty_like"})
    assert record.violations("strict", FP32) == {}
    record.cpp_aten.add("aten::softmax")
    assert record.violations("strict", FP32) == {"forbidden_op": ["c++:aten::softmax"]}
    assert record.violations("permissive", FP32) == {}


@pytest.mark.parametrize("name, short", [
    ("aten::mm.default", "mm"),
    ("aten::mm", "mm"),
    ("aten::_to_copy", "_to_copy"),
    ("aten::add.Tensor", "add"),
    ("torch.Tensor.mm", "mm"),
    ("torch.nn.functional.relu", "relu"),
    ("torch.matmul", "matmul"),
    ("size", "size"),
])
def test_short_name(name, short):
    assert short_name(name) == short
