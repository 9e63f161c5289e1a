"""A candidate's extension build, killed midway, does not block later judges of the same code, and
judges of the same code at once share one build (gpulock.build_folder_lock, taken by the judge).

torch guards a build with a `<name>/lock` file that only the build that made it removes: before the
judge cleared it, every import after a killed build waited on it until the judge's load timeout."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from cudagym.eval.evaluate import EvalConfig, evaluate_candidate
from cudagym.eval.gpulock import build_folder_lock
from cudagym.eval.judge import candidate_key
from cudagym.eval.verdict import Status

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
REPO = FIXTURES.parents[1]
REF, CAND = FIXTURES / "problems" / "add_scale.py", FIXTURES / "honest" / "add_scale_cpp.py"  # a tiny C++ build
EXT_NAME = "cudagym_fx_honest_add_scale_cpp"
# Enough for the build (20-40 s on a 2-core machine); a baton left in place holds the import past it.
BUILD_TIMEOUT_S = 150


def judge(**overrides):
    config = EvalConfig(**{"device": "cpu", "compile_baseline": False, "time_candidate": False, "n_checks": 2,
                           "build_timeout_s": BUILD_TIMEOUT_S, **overrides})
    return evaluate_candidate(REF.read_text(), CAND.read_text(), config)


def build_folder(root: Path) -> Path:
    return root / ("candidate-" + candidate_key(CAND.read_text(), None))


def processes(match) -> list[int]:
    """Live processes for which match(their /proc entry) holds (one that ends meanwhile is left out)."""
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and match(entry):
                pids.append(int(entry.name))
        except OSError:
            continue
    return pids


def start_eval_one() -> subprocess.Popen:
    """`cudagym eval one` of the C++ candidate, in a session of its own (the build folder from the env)."""
    cmd = [sys.executable, "-m", "cudagym", "eval", "one", "--ref", str(REF), "--candidate", str(CAND),
           "--device", "cpu", "--json", "--n-checks", "2"]
    return subprocess.Popen(cmd, cwd=REPO, env=dict(os.environ), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)


def runners_building_in(folder: Path) -> list[int]:
    """Live candidate processes (cudagym.eval.runner) whose build folder is `folder`."""
    return processes(lambda entry: b"cudagym.eval.runner" in (entry / "cmdline").read_bytes()
                     and f"TORCH_EXTENSIONS_DIR={folder}\0".encode() in (entry / "environ").read_bytes())


@pytest.mark.slow
def test_a_build_killed_midway_does_not_block_the_next_judge(tmp_path, monkeypatch):
    """`cudagym eval one` is SIGKILLed while its candidate's extension builds, its build with it (the
    runner's process group: its compilers), as a timeout or a killed rollout does: torch's baton stays
    in the build folder. A later judge of the same code builds and passes within its load timeout."""
    root = tmp_path / "ext"
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(root))
    baton = build_folder(root) / EXT_NAME / "lock"
    proc = start_eval_one()
    try:
        deadline = time.monotonic() + 120
        while not baton.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert baton.exists(), f"the build never started: {proc.poll()=}"
        for pid in runners_building_in(build_folder(root)):  # a runner's session watcher too, which may end meanwhile
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    finally:
        proc.kill()
        proc.wait()
    time.sleep(0.5)
    assert baton.exists(), "the killed build left no baton: nothing is tested"

    t0 = time.monotonic()
    verdict = judge()
    assert verdict.status is Status.PASS, (verdict.reason, time.monotonic() - t0)
    assert not baton.exists()


@pytest.mark.slow
def test_judges_of_the_same_code_at_once_share_one_build(tmp_path, monkeypatch):
    """Two judges of the same candidate start together on an empty cache: one builds while the other
    waits for the build folder, then imports that build; both pass, and ninja compiled once."""
    root = tmp_path / "ext"
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(root))
    verdicts = [None, None]

    def run(i: int) -> None:
        verdicts[i] = judge()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert [v.status for v in verdicts] == [Status.PASS, Status.PASS], [v.reason for v in verdicts]
    folder = build_folder(root)
    assert (root / (folder.name + ".building")).exists()
    log = (folder / EXT_NAME / ".ninja_log").read_text().splitlines()
    outputs = [line.split("\t")[3] for line in log if not line.startswith("#")]  # start, end, mtime, output, hash
    assert sorted(outputs) == [EXT_NAME + ".so", "main.o"], log


@pytest.mark.slow
def test_a_judge_waiting_past_its_load_timeout_for_another_build_says_so(tmp_path, monkeypatch):
    """While another builder holds the folder, the judge waits within its load timeout, not beyond."""
    root = tmp_path / "ext"
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(root))
    (folder := build_folder(root)).mkdir(parents=True)
    with build_folder_lock(str(folder), timeout_s=0):
        verdict = judge(build_timeout_s=5)
    assert verdict.status is Status.TIMEOUT, verdict.reason
    assert verdict.reason == "candidate did not load within 5 s: it was waiting for another build of the same candidate"


def processes_mentioning(text: str) -> list[int]:
    """Live processes whose command line holds `text` (a build folder: ninja, the compiler driver, cc1plus)."""
    return processes(lambda entry: text.encode() in (entry / "cmdline").read_bytes())


def compiling_in(folder: str) -> bool:
    return bool(processes(lambda entry: folder.encode() in (cmdline := (entry / "cmdline").read_bytes())
                          and b"cc1plus" in cmdline))


@pytest.mark.slow
def test_the_compilers_of_a_killed_judge_die_with_it(tmp_path, monkeypatch):
    """`cudagym eval one` is SIGKILLed mid-build (a deadline, a stopped batch): its judge and the
    candidate's process die with it, and so do the compilers that process started, instead of
    compiling on for tens of seconds beside the judges that come next."""
    root = tmp_path / "ext"
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(root))
    folder = str(build_folder(root))
    proc = start_eval_one()
    try:
        deadline = time.monotonic() + 120
        while not compiling_in(folder) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert processes_mentioning(folder), f"no compiler ever ran: {proc.poll()=}"
        proc.kill()  # the CLI alone, as a timeout's SIGKILL: nothing of it can clean up
        proc.wait()
        deadline = time.monotonic() + 10
        while processes_mentioning(folder) and time.monotonic() < deadline:
            time.sleep(0.1)
        left = processes_mentioning(folder)
        assert not left, [Path(f"/proc/{pid}/cmdline").read_bytes()[:200] for pid in left]
    finally:
        for pid in processes_mentioning(folder):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
