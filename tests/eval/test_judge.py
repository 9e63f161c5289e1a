"""Pure pieces of the judge: timing layout, reply validation, input widening, task metadata."""

from __future__ import annotations

import pytest
import torch

from cudagym.eval.judge import CandidateFailed, footprint_bytes, load_reference, rep_layout, reply_ms, task_dtypes, widened

REF = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.lin = nn.Linear(n, n)

    def forward(self, x):
        return torch.relu(self.lin(x))

def get_inputs():
    return [torch.rand(32, 64)]

def get_init_inputs():
    return [64]
"""


@pytest.mark.parametrize("n_sets", [2, 3, 4])
def test_each_timing_buffer_holds_different_inputs_on_consecutive_uses(n_sets):
    last_content = {}
    for i in range(40):
        slot, content = rep_layout(i, n_sets)
        assert slot in (0, 1) and 0 <= content < n_sets
        if slot in last_content:
            assert content != last_content[slot], "a pointer-keyed cache would hit"
        last_content[slot] = content


@pytest.mark.parametrize("ms", [None, "1.0", -1.0, float("nan"), float("inf"), True, 1e9])
def test_a_reply_time_that_is_not_a_time_is_timer_tamper(ms):
    with pytest.raises(CandidateFailed) as failure:
        reply_ms({"ok": True, "ms": ms})
    assert failure.value.status == "rejected" and "timer_tamper" in failure.value.flags


def test_a_plausible_reply_time_is_returned_as_float():
    assert reply_ms({"ok": True, "ms": 3}) == 3.0


def test_widened_inputs_are_signed_with_the_same_scale_and_leave_integers_alone():
    x = torch.rand(1000, 100) * 4  # [0, 4): mean |x| = 2
    idx = torch.arange(10)
    wide_x, wide_idx = widened([x, idx], seed=0)
    assert (wide_x < 0).float().mean() > 0.4
    assert abs(wide_x.abs().mean().item() - 2 * (2 / torch.pi) ** 0.5) < 0.1  # |N(0, 2)| has mean 2 sqrt(2/pi)
    assert wide_idx is idx


def test_task_metadata_comes_from_meta_tensors():
    ref = load_reference(REF)
    assert task_dtypes(ref, [64]) == {"float32"}
    weights, inputs = (64 * 64 + 64) * 4, 32 * 64 * 4
    assert footprint_bytes(ref, [64]) == 14 * inputs + 4 * weights + 2 * 2**30


def test_a_reference_without_get_inputs_is_refused():
    with pytest.raises(ValueError, match="get_inputs"):
        load_reference(REF.replace("def get_inputs", "def other_inputs"))
