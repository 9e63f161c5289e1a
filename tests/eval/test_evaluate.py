"""The driver: cheap validation and config checks, then end-to-end verdicts through the judge and
runner processes (CPU, permissive policy, a tiny reference: each run takes several seconds)."""

from __future__ import annotations

import os
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from cudagym.eval.evaluate import CandidateError, EvalConfig, evaluate_candidate, out_of_memory, validate_candidate
from cudagym.eval.verdict import Status

PROBLEMS = Path(__file__).resolve().parents[1] / "fixtures" / "problems"
REF = (PROBLEMS / "add_scale.py").read_text()  # out = x * 2 + y, x and y of shape (64, 256)

REF_WITH_ARGS = textwrap.dedent("""
    import torch.nn as nn

    class Model(nn.Module):
        def __init__(self, in_features, out_features):
            super().__init__()
            self.linear = nn.Linear(in_features, out_features)

        def forward(self, x):
            return self.linear(x)
""")


def candidate(forward_body: str, init: str = "def __init__(self):") -> str:
    return (f"import torch\nimport torch.nn as nn\n\n\nclass ModelNew(nn.Module):\n    {init}\n"
            f"        super().__init__()\n\n    def forward(self, x, y):\n"
            + textwrap.indent(textwrap.dedent(forward_body).strip() + "\n", " " * 8))


HONEST = candidate("return torch.add(x * 2.0, y)")


# -- validate_candidate ---------------------------------------------------------------------------
def test_valid_candidate_passes_validation():
    validate_candidate(REF, HONEST)
    validate_candidate(REF_WITH_ARGS, candidate("return x", init="def __init__(self, in_features, out_features):"))
    validate_candidate(REF_WITH_ARGS, candidate("return x", init="def __init__(self, *args):"))
    validate_candidate(REF_WITH_ARGS, "import torch.nn as nn\nclass ModelNew(nn.Linear):\n    pass\n")  # inherits


def test_syntax_error_is_candidate_error():
    with pytest.raises(CandidateError, match="syntax error at line 2"):
        validate_candidate(REF, "import torch\ndef forward(:\n")


@pytest.mark.parametrize("code", [
    "import torch\nclass Model(torch.nn.Module):\n    pass\n",
    "import torch\nclass Modelnew(torch.nn.Module):\n    pass\n",
    "ModelNew = 3\n",
    "",
])
def test_no_model_new_is_candidate_error(code):
    with pytest.raises(CandidateError, match="no class ModelNew"):
        validate_candidate(REF, code)


@pytest.mark.parametrize("ref, init", [
    (REF_WITH_ARGS, "def __init__(self, in_features):"),  # too few
    (REF_WITH_ARGS, "def __init__(self, a, b, c):"),  # too many required
    (REF_WITH_ARGS, "def __init__(self):"),  # none, Model takes two
    (REF, "def __init__(self, in_features):"),  # Model takes none
])
def test_wrong_init_arity_is_candidate_error(ref, init):
    with pytest.raises(CandidateError, match="arguments"):
        validate_candidate(ref, candidate("return x", init=init))


# -- EvalConfig -----------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, match", [
    ({"policy": "lenient"}, "policy"),
    ({"timing_mode": "wallclock"}, "timing mode"),
    ({"n_checks": 1}, "n_checks"),
    ({"n_checks": 0}, "n_checks"),
])
def test_eval_config_rejects_bad_values(kwargs, match):
    with pytest.raises(ValueError, match=match):
        EvalConfig(**kwargs)


def test_eval_config_accepts_good_values():
    config = EvalConfig(policy="permissive", timing_mode="paper", n_checks=2)
    assert config.judge_timeout_s > config.build_timeout_s


def test_the_kernelbench_timing_mode_times_each_call_in_its_own_synchronised_window():
    from cudagym.eval.batch import baseline_method
    from cudagym.eval.timing import timer_method
    assert EvalConfig(timing_mode="kernelbench").timing_mode == "kernelbench"
    assert [timer_method(m) for m in ("strict", "kernelbench")] == ["queued", "window"]
    # Its baselines are keyed apart from strict's on a GPU, so neither run ever reuses the other's.
    assert baseline_method("kernelbench", "NVIDIA H200") == "kernelbench"
    assert baseline_method("strict", "NVIDIA H200") == "strict-queued"


def test_compile_error_verdict_without_a_process():
    verdict = evaluate_candidate(REF, "class ModelNew(:\n", EvalConfig(device="cpu"))
    assert verdict.status is Status.COMPILE_ERROR and verdict.reward == -1 and "syntax error" in verdict.reason


# -- end to end -----------------------------------------------------------------------------------
CPU = dict(device="cpu", policy="permissive", compile_baseline=False, max_timing_s=1, min_reps=5, max_reps=20)


@pytest.mark.slow
@pytest.mark.parametrize("timing_mode", ["strict", "kernelbench"])
def test_honest_candidate_passes(timing_mode):
    verdict = evaluate_candidate(REF, HONEST, EvalConfig(**CPU, timing_mode=timing_mode))
    assert verdict.status is Status.PASS, verdict.reason
    assert verdict.timing_mode == timing_mode
    assert verdict.correct and verdict.flags == []
    assert verdict.t_candidate_ms and verdict.t_candidate_ms > 0
    assert verdict.t_eager_ms and verdict.t_eager_ms > 0
    assert verdict.t_compile_ms is None  # compile baseline off
    assert verdict.speedup_vs_eager == pytest.approx(verdict.t_eager_ms / verdict.t_candidate_ms)
    assert verdict.reward in {1, 2, 3}
    # max_reps bounds a rep count, except that a call under FAST_MS gets FAST_MIN_REPS (its median is
    # otherwise one descheduled launch away from moving): this tiny CPU call is one of those.
    from cudagym.eval.timing import FAST_MAX_REPS, FAST_MS

    reps = verdict.timing["reps"]
    assert reps <= (FAST_MAX_REPS if verdict.t_candidate_ms < FAST_MS else 20)  # (the 1 s time bound may end it sooner)
    assert verdict.env.get("sandbox") == "full" or verdict.env.get("sandbox", "").startswith("partial")


@pytest.mark.parametrize("reason, oom", [  # reasons as judges on the H200 reported them
    ("OutOfMemoryError: CUDA out of memory. Tried to allocate 8.00 GiB.", True),
    ("AcceleratorError: CUDA error: out of memory Search for `cudaErrorMemoryAllocation'", True),
    ("evaluation failed: RuntimeError: cuDNN error: CUDNN_STATUS_INTERNAL_ERROR", True),
    ("evaluation failed: RuntimeError: cuDNN error: CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED", True),
    ("RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`", True),
    ("check 0: max abs diff 0.5 > atol", False),
    ("RuntimeError: CUDA error: an illegal memory access was encountered", False),
])
def test_running_out_of_gpu_memory_is_recognised_in_all_its_wordings(reason, oom):
    assert out_of_memory({"status": "runtime_error", "reason": reason}) is oom
    # the filter's measurement names its failure `error`: an OOM there is the run's, not the task's
    assert out_of_memory({"stage": "compile", "error": reason}) is oom


REDUCTION = textwrap.dedent("""
    import torch
    import torch.nn as nn

    class Model(nn.Module):
        def forward(self, x):
            return torch.amax(x, dim=1)

    def get_inputs():
        return [torch.rand(2048, 16384)]  # 128 MiB in, 8 KiB out

    def get_init_inputs():
        return []
""")


@pytest.mark.slow
def test_a_cheap_call_on_big_inputs_is_not_timer_tamper():
    """Loading a rep's inputs (a copy of 128 MiB) takes longer than the call itself reads them; the
    wall-clock yardstick must count that load, or an honest reduction looks too fast to be true."""
    honest = "import torch\nimport torch.nn as nn\nclass ModelNew(nn.Module):\n    def forward(self, x):\n        return x.amax(1)\n"
    verdict = evaluate_candidate(REDUCTION, honest, EvalConfig(**CPU))
    assert verdict.status is Status.PASS, (verdict.reason, verdict.timing)
    assert "timer_tamper" not in verdict.flags


@pytest.mark.slow
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores")
def test_the_candidate_is_checked_on_the_work_cores_and_timed_on_the_timing_cores():
    """The candidate's process reports, by failing on purpose, the cores it ran on when timed."""
    work, timing = sorted(os.sched_getaffinity(0))[:1], sorted(os.sched_getaffinity(0))[-1:]
    probe = candidate(f"""
        import os
        cores = sorted(os.sched_getaffinity(0))
        if cores != {work}:  # the checks come first, then the timed reps
            raise RuntimeError(f"{{'timed' if getattr(self, 'checked', False) else 'checked'}} on cores {{cores}}")
        self.checked = True
        return torch.add(x * 2.0, y)
    """)
    config = EvalConfig(**CPU, static_checks=False, timing_cpus=tuple(timing), work_cpus=tuple(work))
    verdict = evaluate_candidate(REF, probe, config)
    assert verdict.status is Status.RUNTIME_ERROR and f"timed on cores {timing}" in verdict.reason, verdict.reason


# Failure cases run side by side (they do no timing, so contention cannot change their verdicts).
FAILING = {
    "raises": (candidate("raise RuntimeError('boom-sentinel-4711')"), {}),
    # static_checks off: they would reject time.sleep (timing_access) before anything runs.
    "sleeps": (candidate("import time\nwhile True:\n    time.sleep(1)"), {"timeout_s": 3, "static_checks": False}),
    "segfaults": (candidate("import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\nreturn x"),
                  {"static_checks": False}),
    "wrong_shape": (candidate("return (x * 2 + y)[:, :10]"), {}),
    "allocates_4gb": (candidate("big = torch.ones(2 ** 30)  # 4 GiB, written\nreturn x * 2 + y + big[0]"),
                      {"memory_limit_gb": 1}),
}


@pytest.fixture(scope="module")
def escape_path(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("outside") / "escaped.txt"


@pytest.fixture(scope="module")
def failing_verdicts(escape_path):
    # uid 0 with CAP_SYS_ADMIN in its mount namespace could remount every mount read-write again, then
    # write: the candidate's process gives its capabilities up once its mounts are made
    remount = ("import ctypes\nlibc = ctypes.CDLL(None)\nfor line in open('/proc/self/mounts'):\n"
               "    libc.mount(None, line.split()[1].encode(), None, 32 | 4096, None)  # MS_REMOUNT | MS_BIND: rw\n")
    escaped_by_remount = escape_path.with_name("remounted.txt")
    cases = dict(FAILING, writes_outside=(
        candidate(f"with open({str(escape_path)!r}, 'w') as f:\n    f.write('x')\nreturn x * 2 + y"),
        {"static_checks": False}), remounts_then_writes=(
        candidate(remount + f"with open({str(escaped_by_remount)!r}, 'w') as f:\n    f.write('x')\nreturn x * 2 + y"),
        {"static_checks": False}))
    with ThreadPoolExecutor(max_workers=3) as pool:
        futures = {name: pool.submit(evaluate_candidate, REF, code, EvalConfig(**CPU, **overrides))
                   for name, (code, overrides) in cases.items()}
        return {name: future.result() for name, future in futures.items()}


@pytest.mark.slow
def test_exception_in_forward_is_runtime_error(failing_verdicts):
    verdict = failing_verdicts["raises"]
    assert verdict.status is Status.RUNTIME_ERROR
    assert "boom-sentinel-4711" in verdict.reason and "RuntimeError" in verdict.reason
    assert verdict.reward == -1 and verdict.t_candidate_ms is None


@pytest.mark.slow
def test_hang_in_forward_is_timeout(failing_verdicts):
    verdict = failing_verdicts["sleeps"]
    assert verdict.status is Status.TIMEOUT, verdict.reason
    assert "3 s" in verdict.reason and verdict.reward == -1


@pytest.mark.slow
def test_segfault_is_runtime_error(failing_verdicts):
    verdict = failing_verdicts["segfaults"]
    assert verdict.status is Status.RUNTIME_ERROR
    assert "SIGSEGV" in verdict.reason


def test_segfault_candidate_is_rejected_by_static_checks():
    code = FAILING["segfaults"][0]
    verdict = evaluate_candidate(REF, code, EvalConfig(**CPU))  # no process: static checks fire first
    assert verdict.status is Status.REJECTED and verdict.flags
    assert verdict.reason.startswith("static checks fired")


@pytest.mark.slow
def test_wrong_shape_is_incorrect(failing_verdicts):
    verdict = failing_verdicts["wrong_shape"]
    assert verdict.status is Status.INCORRECT
    assert "shape" in verdict.reason and "(64, 10)" in verdict.reason


@pytest.mark.slow
def test_memory_blowup_is_runtime_error(failing_verdicts):
    verdict = failing_verdicts["allocates_4gb"]
    assert verdict.status is Status.RUNTIME_ERROR
    assert "memory" in verdict.reason


@pytest.mark.slow
def test_write_outside_workdir_fails_and_leaves_nothing(failing_verdicts, escape_path):
    verdict = failing_verdicts["writes_outside"]
    assert verdict.status is not Status.PASS
    assert not escape_path.exists()
    assert escape_path.parent.is_dir()  # the directory was there to write into


@pytest.mark.slow
def test_a_candidate_cannot_remount_its_file_system_writable(failing_verdicts, escape_path):
    verdict = failing_verdicts["remounts_then_writes"]
    assert verdict.status is Status.RUNTIME_ERROR and "Read-only file system" in verdict.reason, verdict.reason
    assert not escape_path.with_name("remounted.txt").exists()
    if os.geteuid() == 0:
        assert verdict.env.get("sandbox") == "full", verdict.env  # isolated, then every capability given up


def test_the_judge_gets_no_secrets_from_the_environment():
    """An API key or token in the caller's environment never reaches a judge (and so the candidate it
    runs, which could hand it back in an exception's text, i.e. in the verdict's reason)."""
    from cudagym.eval.evaluate import without_secrets

    env = {"OPENAI_API_KEY": "sk-1", "HF_TOKEN": "hf_1", "AWS_SECRET_ACCESS_KEY": "a", "DB_PASSWORD": "p",
           "PATH": "/usr/bin", "TORCH_EXTENSIONS_DIR": "/x", "CUDA_VISIBLE_DEVICES": "0", "OMP_NUM_THREADS": "1"}
    assert without_secrets(env) == {"PATH": "/usr/bin", "TORCH_EXTENSIONS_DIR": "/x", "CUDA_VISIBLE_DEVICES": "0",
                                    "OMP_NUM_THREADS": "1"}


@pytest.mark.slow
def test_a_candidate_cannot_read_a_key_of_the_callers_environment(monkeypatch):
    """End to end: the candidate's process looks for the key and reports what it sees in its error."""
    monkeypatch.setenv("CUDAGYM_TEST_API_KEY", "sk-secret-value")
    leaky = candidate("return x", init="def __init__(self):\n        import os\n"
                      "        raise RuntimeError('key=' + os.environ.get('CUDAGYM_TEST_API_KEY', 'absent'))")
    verdict = evaluate_candidate(REF, leaky, EvalConfig(**dict(CPU, static_checks=False, policy="permissive")))
    assert verdict.status is Status.RUNTIME_ERROR and "key=absent" in verdict.reason, verdict.reason
    assert "sk-secret-value" not in verdict.to_json()


@pytest.mark.slow
@pytest.mark.parametrize("band, rounds", [(1e9, 3), (0.0, 0)])  # every speedup at the edge; none
def test_a_speedup_at_a_milestones_edge_is_timed_in_three_rounds_on_fresh_inputs(band, rounds):
    verdict = evaluate_candidate(REF, HONEST, EvalConfig(**CPU, edge_band=band))
    assert verdict.status is Status.PASS, verdict.reason
    kept = verdict.timing.get("rounds", [])
    assert len(kept) == rounds
    if rounds:
        import statistics

        assert verdict.t_candidate_ms == statistics.median(r["t_candidate_ms"] for r in kept)
        assert verdict.t_eager_ms == statistics.median(r["t_eager_ms"] for r in kept)
        assert len({r["t_candidate_ms"] for r in kept}) > 1  # three measurements, not one copied
        # every round's timed outputs were checked: more than the reps of the one round whose statistics stand
        assert verdict.timing["timed_outputs_checked"] > verdict.timing["reps"]
