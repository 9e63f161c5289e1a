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
    # a baseline's judge and a compile-only one hold fewer copies: the ledger admits more of them
    assert footprint_bytes(ref, [64], "baseline") == 8 * inputs + 2 * weights + 2 * 2**30
    assert footprint_bytes(ref, [64], "warm") == 4 * inputs + 2 * weights + 2 * 2**30
    assert footprint_bytes(ref, [64], "audit") == footprint_bytes(ref, [64])


def test_a_reference_without_get_inputs_is_refused():
    with pytest.raises(ValueError, match="get_inputs"):
        load_reference(REF.replace("def get_inputs", "def other_inputs"))


# -- the milestone's edge: speedups there are timed in several rounds ------------------------------
def test_near_milestone_marks_speedups_around_the_five_percent_milestone():
    from cudagym.eval.verdict import near_milestone

    edge = 1 / 0.95  # the reward's 5%: the call is 5% shorter than the baseline's
    assert near_milestone(1.0, edge, 0.01)
    assert near_milestone(1.0, 1.0, 0.08) and near_milestone(1.0, 1.12, 0.08)  # x1.00 and x1.12 are within 8%
    assert not near_milestone(1.0, 0.96, 0.08) and not near_milestone(1.0, 1.15, 0.08)
    assert not near_milestone(1.0, 2.0, 0.08) and not near_milestone(1.0, 0.5, 0.08)
    assert not near_milestone(1.0, None, 0.08) and not near_milestone(None, 1.0, 0.08)
    assert not near_milestone(1.0, edge, 0.0)  # band 0: never


def test_at_milestone_edge_looks_at_eager_live_compile_and_a_stored_compile():
    from cudagym.eval.judge import at_milestone_edge

    far = {"t_candidate_ms": 1.0, "t_eager_ms": 2.0}
    assert not at_milestone_edge(far, 0.08)
    assert at_milestone_edge({"t_candidate_ms": 1.0, "t_eager_ms": 1.04}, 0.08)
    assert at_milestone_edge(dict(far, t_compile_ms=1.06), 0.08)  # eager far, compile at the edge
    assert at_milestone_edge(far, 0.08, known_compile_ms=1.06)  # the stored baseline's compile time
    assert not at_milestone_edge(dict(far, t_compile_ms=3.0), 0.08, known_compile_ms=1.06)  # a live one wins
    assert not at_milestone_edge({"t_candidate_ms": 1.0, "t_eager_ms": 1.04}, 0.0)


def test_median_round_takes_each_time_from_the_median_round_and_keeps_them_all():
    from cudagym.eval.judge import median_round
    from cudagym.eval.verdict import milestone_reward

    rounds = [{"t_candidate_ms": 1.00, "t_eager_ms": 1.07, "t_compile_ms": 1.2, "timing": {"reps": 100, "timed_outputs_checked": 100}},
              {"t_candidate_ms": 1.03, "t_eager_ms": 1.01, "t_compile_ms": 1.1, "timing": {"reps": 110, "timed_outputs_checked": 110}},
              {"t_candidate_ms": 0.98, "t_eager_ms": 1.02, "t_compile_ms": 1.3, "timing": {"reps": 120, "timed_outputs_checked": 120}}]
    out = median_round(rounds)
    assert (out["t_candidate_ms"], out["t_eager_ms"], out["t_compile_ms"]) == (1.00, 1.02, 1.2)
    assert out["timing"]["reps"] == 100  # the statistics of the round whose candidate time is the median
    assert [r["t_candidate_ms"] for r in out["timing"]["rounds"]] == [1.00, 1.03, 0.98]
    assert out["timing"]["timed_outputs_checked"] == 330  # every round's checked outputs
    assert "rounds" not in rounds[0]["timing"]  # the rounds themselves are left as they were
    # The first round alone would give reward 3 (x1.07 vs eager); the medians give 1, as two rounds of three do.
    assert milestone_reward(True, 1.00, 1.07, 1.2) == 3 and milestone_reward(True, 1.00, 1.02, 1.2) == 1
    assert median_round(rounds[:1]) is rounds[0]
    no_compile = median_round([dict(r, t_compile_ms=None) for r in rounds])
    assert no_compile["t_compile_ms"] is None
    # Further rounds do not time compile again: the first round's compile time and statistics stand.
    first_only = median_round([dict(rounds[0], compile={"reps": 7})] + [dict(r, t_compile_ms=None) for r in rounds[1:]])
    assert first_only["t_compile_ms"] == 1.2 and first_only["compile"] == {"reps": 7}


BUILT_ON = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self, n, needs_cpu):
        super().__init__()
        self.built_on = torch.empty(1).device.type  # where the factory functions drew this model's tensors
        if needs_cpu:
            torch.zeros(n).numpy()  # CPU only: on any other device this raises
        self.lin = nn.Linear(n, n)

    def forward(self, x):
        return self.lin(x)

def get_inputs():
    return [torch.rand(4, 8)]

def get_init_inputs():
    return [8, NEEDS_CPU]
"""


@pytest.mark.parametrize("needs_cpu", [False, True])
def test_a_baselines_model_is_drawn_on_its_device_unless_its_init_needs_the_cpu(tmp_path, needs_cpu):
    # "meta" stands in for a GPU on this machine: the same path (draw on the device, else build on the
    # CPU and move), without a GPU.
    from cudagym.eval.judge import Evaluation, Request
    req = Request(mode="baseline", ref_code=BUILT_ON.replace("NEEDS_CPU", str(needs_cpu)), workdir=str(tmp_path),
                  device="meta", seed=1)
    ev = Evaluation(req)
    ev.build_model(on_device=True)
    assert ev.model.built_on == ("cpu" if needs_cpu else "meta")
    assert ev.model.lin.weight.device.type == "meta"
    ev.build_model()  # a candidate's reference: drawn on the CPU, as the candidate's own copy is
    assert ev.model.built_on == "cpu" and ev.model.lin.weight.device.type == "meta"
