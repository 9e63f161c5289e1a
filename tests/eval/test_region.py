"""Correctness inputs that defeat partial computation: region checks and what the audit measures.

A kernel that estimates a loss from a sample of its rows, reads every k-th element or stops early
passes atol = rtol = 1e-2 on i.i.d. inputs. The judge's region checks amplify one secret region of
an input until the reference's output moves; such a kernel then misses the change or overweights
it. CPU, permissive policy (the cheats use torch ops; the same class in C++ and CUDA is in
tests/fixtures/hacks/partial_input_*)."""

from __future__ import annotations

import random
import textwrap
from pathlib import Path

import pytest
import torch

from cudagym.eval import checks
from cudagym.eval.evaluate import EvalConfig, evaluate_candidate, run_reference_job
from cudagym.eval.judge import find_region
from cudagym.eval.verdict import Status
from cudagym.tasks import Task

PROBLEMS = Path(__file__).resolve().parents[1] / "fixtures" / "problems"
MSE = (PROBLEMS / "mse_rand.py").read_text()  # mean((p - t) ** 2) over (64, 1024) torch.rand pairs
CPU = dict(device="cpu", policy="permissive", n_checks=3, compile_baseline=False, timeout_s=60)


def candidate(body: str) -> str:
    return ("import torch\nimport torch.nn as nn\n\n\nclass ModelNew(nn.Module):\n    def forward(self, predictions, targets):\n"
            + textwrap.indent(textwrap.dedent(body).strip() + "\n", " " * 8))


PARTIAL = {
    "sampled_rows": "d = predictions[::8] - targets[::8]\nreturn torch.mean(d * d)",
    "strided_elements": "d = (predictions - targets).reshape(-1)[3::16]\nreturn torch.mean(d * d)",
    "early_exit": "n = predictions.shape[0] // 4\nd = predictions[:n] - targets[:n]\nreturn torch.mean(d * d)",
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(PARTIAL))
def test_a_kernel_reading_part_of_its_input_is_not_accepted(name):
    code = candidate(PARTIAL[name])
    ns: dict = {}
    exec(compile(MSE, "mse", "exec"), ns)
    model, fake = ns["Model"](), {}
    exec(compile(code, "cand", "exec"), fake)
    for seed in range(5):  # the cheat is right on the problem's own inputs: a naive harness passes it
        torch.manual_seed(seed)
        p, t = ns["get_inputs"]()
        assert torch.allclose(fake["ModelNew"]()(p, t), model(p, t), atol=1e-2, rtol=1e-2)
    verdict = evaluate_candidate(MSE, code, EvalConfig(**CPU))
    # (On inputs small enough for a float64 reference, the precision check flags such estimates too;
    # on multi-GB GPU problems it cannot run and the region checks are what is left.)
    assert verdict.status is not Status.PASS and not verdict.correct, (verdict.status, verdict.reason)


@pytest.mark.slow
def test_the_honest_loss_passes_the_region_checks():
    verdict = evaluate_candidate(MSE, candidate("d = predictions - targets\nreturn (d * d).sum() / d.numel()"),
                                 EvalConfig(**CPU))
    assert verdict.status is Status.PASS, verdict.reason
    assert len(verdict.timing["info"]["region_checks"]) == 2  # a gentle and a strong one
    assert not any(r.startswith("skipped") for r in verdict.timing["info"]["region_checks"])


class Mse(torch.nn.Module):
    def forward(self, p, t):
        return torch.mean((p - t) ** 2)


class Saturated(torch.nn.Module):
    """Output independent of every single region: no region check can be made."""

    def forward(self, x):
        return torch.sigmoid(x).mean() * 0 + 1


def test_find_region_moves_the_output_and_restores_the_input():
    inputs = [torch.rand(64, 1024), torch.rand(64, 1024)]
    saved = [x.clone() for x in inputs]
    where, amplify, ref_base, ref_amp = find_region(Mse(), inputs, random.Random(1))
    assert checks.rel_l2(ref_amp, ref_base) >= 0.02
    with amplify():
        assert not all(torch.equal(a, b) for a, b in zip(inputs, saved))
        assert torch.allclose(Mse()(*inputs), ref_amp[0])
    assert all(torch.equal(a, b) for a, b in zip(inputs, saved)), "the input set was not restored"
    assert where.startswith("input ")


class RowCenter(torch.nn.Module):
    def forward(self, x):
        return x - x.mean(dim=1, keepdim=True)


def test_a_row_mean_from_every_eighth_element_does_not_follow_a_strong_region_check():
    """out = x - mean(row): an estimate of the mean from a sample is within 1e-2 on i.i.d. inputs, and
    the amplified element's own output is right whatever the mean is; only the change of the other
    outputs of its row tells, and only where the amplification moved them beyond fp32 noise. Where the
    secret element is one of the sampled ones, the estimate overweights it and the amplified set's own
    check fails already; otherwise only the change tells. Over several draws, both happen."""
    def sampled(t):
        return t - t[:, ::8].mean(dim=1, keepdim=True)

    caught_by = []
    for seed in range(8):
        x = torch.rand(4, 65536, generator=torch.Generator().manual_seed(seed))
        where, amplify, ref_base, ref_amp = find_region(RowCenter(), [x], random.Random(seed), strongest=True)
        gentle = find_region(RowCenter(), [x], random.Random(seed))
        assert float(where.rsplit("x", 1)[1]) > float(gentle[0].rsplit("x", 1)[1])  # a larger amplification
        base_out = sampled(x)
        assert checks.compare([base_out], ref_base, checks.Tolerance()) is None  # passes the plain check
        err_base = [base_out - ref_base[0]]
        with amplify():
            amp_out = sampled(x)
            honest = RowCenter()(x)
        # the honest computation passes and follows the change
        assert checks.compare([honest], ref_amp, checks.Tolerance()) is None
        assert checks.change_mismatch([honest], [ref_amp[0].clone()], [ref_base[0].clone()], [torch.zeros_like(honest)],
                                      checks.Tolerance(), 0.25) is None
        if checks.compare([amp_out], ref_amp, checks.Tolerance()) is not None:
            caught_by.append("amplified check")
            continue
        found = checks.change_mismatch([amp_out], [ref_amp[0].clone()], [ref_base[0].clone()], err_base,
                                       checks.Tolerance(), 0.25)
        assert found and "elements" in found, f"seed {seed}: the sampled mean passed both checks"
        caught_by.append("change")
    assert "change" in caught_by  # the case the change check exists for


def test_find_region_gives_up_where_no_region_matters():
    assert find_region(Saturated(), [torch.rand(32, 32)], random.Random(0)) is None


def test_find_region_keeps_the_reference_finite():
    class Exp(torch.nn.Module):
        def __init__(self, k):
            super().__init__()
            self.k = k

        def forward(self, x):
            return torch.exp(x * self.k).sum(dim=1)

    found = find_region(Exp(2.0), [torch.rand(16, 16)], random.Random(0))
    assert found is not None and bool(torch.isfinite(found[3][0]).all())
    for seed in range(5):  # near overflow: an amplified set is used only where the reference stays finite
        found = find_region(Exp(60.0), [torch.rand(16, 16)], random.Random(seed))
        assert found is None or bool(torch.isfinite(found[3][0]).all())
    assert find_region(Exp(60.0), [torch.rand(16, 16) * 0.5 + 0.75], random.Random(0)) is None  # any amplification overflows


# -- the audit: near-degenerate problems, affine shortcuts, cost ----------------------------------
def problem(forward: str, inputs: str, init: str = "", init_args: str = "[]") -> str:
    return textwrap.dedent(f"""
        import torch
        import torch.nn as nn

        class Model(nn.Module):
            def __init__(self):
                super().__init__()
        {textwrap.indent(textwrap.dedent(init).strip(), ' ' * 8)}

            def forward(self, x):
                return {forward}

        def get_inputs():
            return [{inputs}]

        def get_init_inputs():
            return {init_args}
    """)


def audit(code: str, n_checks: int = 3) -> dict:
    task = Task(id="t", name="t", code=code)
    found = run_reference_job(task, "audit", EvalConfig(device="cpu", n_checks=n_checks))
    assert "accepts" in found, found
    found["degenerate"] = checks.degenerate_reason({**found, "stochastic": found["stochastic_ops"]})
    return found


@pytest.mark.slow
@pytest.mark.parametrize("n_checks", [2, 5])
def test_batchnorm_of_iid_inputs_accepts_an_affine_answer(n_checks):
    """BatchNorm of torch.rand is (x - 0.5) / 0.289 in every channel: skipping the statistics passes."""
    found = audit(problem("self.bn(x)", "torch.rand(64, 2, 64, 64)", init="self.bn = nn.BatchNorm2d(2)"), n_checks)
    assert "affine" in found["accepts"] and found["degenerate"]


@pytest.mark.slow
def test_an_affine_problem_is_not_degenerate_for_being_affine():
    found = audit(problem("x * 3.0 - 1.0", "torch.rand(64, 64)"))
    assert "affine" not in found["accepts"] and found["degenerate"] is None, found


@pytest.mark.slow
def test_an_output_that_barely_depends_on_its_input_is_near_degenerate():
    """One column follows the input, the other 255 are ~100: no probe passes elementwise, but the
    output moves by < 1% (rel. L2) between input sets."""
    found = audit(problem("torch.cat([x[:, :1] * 10, x[:, 1:] * 1e-3 + 100], 1)", "torch.rand(64, 256)"))
    assert "input_independent" not in found["accepts"] and "input_independent" in found["near"], found
    assert found["input_sensitivity"] < 0.01 and "rel. L2" in found["degenerate"]


@pytest.mark.slow
def test_audit_measures_flops_and_bytes():
    found = audit(problem("self.fc(x)", "torch.rand(8, 32)", init="self.fc = nn.Linear(32, 16)"))
    assert found["cost"]["flops"] == 2 * 8 * 32 * 16
    assert found["cost"]["bytes"] == 4 * (8 * 32 + 32 * 16 + 16 + 8 * 16)
