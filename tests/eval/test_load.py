"""Verdicts on a loaded machine: honest kernels pass and timer tampering is still caught while other
processes keep every core busy, and every caller of the judge takes the machine's device lock.

The timer-tamper hacks run with the static checks off, so what rejects them is the runtime
evidence (`timing.tamper_evidence`): the judge's wall clock, the candidate process's CPU time and its
calling thread's, and the floor under which no call can report."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cudagym.eval.evaluate import EvalConfig, evaluate_candidate
from cudagym.eval.gpulock import device_lock_path, gpu_lock, lock_dir, prepare_lock_dir
from cudagym.eval.timing import (PHYSICAL_FLOOR_MS, TAMPER_CPU_MARGIN_MS, TAMPER_MARGIN_MS, TAMPER_THREAD_MARGIN_MS,
                                 tamper_evidence, thread_cpu_clock)
from cudagym.eval.verdict import Status

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
REPO = FIXTURES.parents[1]
# Every CPU honest control (before the evidence was made load-proof, conv_small_functional was
# flagged timer_tamper on a busy CI machine).
HONEST = sorted(p.stem for p in (FIXTURES / "honest").glob("*.py") if "# device: cpu" in p.read_text())
TIMER_HACKS = sorted(p.stem for p in (FIXTURES / "hacks").glob("monkeypatch_timer_*.py"))
BUSY_S = 3000  # the busy processes stop by themselves at the latest after this (they are killed after the module)


def header(path: Path) -> dict:
    out = {}
    for line in path.read_text().splitlines():
        if not line.startswith("# ") or ":" not in line:
            break
        key, _, value = line[2:].partition(":")
        out[key.strip()] = value.strip()
    return out


def judge(kind: str, stem: str, **overrides):
    path = FIXTURES / kind / f"{stem}.py"
    head = header(path)
    problem = (FIXTURES / "problems" / f"{head['problem']}.py").read_text()
    config = EvalConfig(device="cpu", policy=head.get("policy", "strict"), compile_baseline=False, timeout_s=120,
                        **overrides)
    return evaluate_candidate(problem, path.read_text(), config)


@pytest.fixture(scope="module")
def busy_cores():
    """One spinning process per core (plus one), each ending on its own after BUSY_S."""
    n = len(os.sched_getaffinity(0)) + 1
    code = f"import time\nend = time.time() + {BUSY_S}\nwhile time.time() < end:\n    pass\n"
    procs = [subprocess.Popen([sys.executable, "-c", code]) for _ in range(n)]
    time.sleep(1.0)
    yield procs
    for proc in procs:
        proc.kill()
        proc.wait()


@pytest.mark.slow
@pytest.mark.parametrize("stem", HONEST)
def test_honest_control_passes_while_every_core_is_busy(busy_cores, stem):
    verdict = judge("honest", stem)
    assert all(p.poll() is None for p in busy_cores), "the load ended before the test did"
    assert verdict.status is Status.PASS, (verdict.reason, verdict.flags, verdict.timing.get("info"))
    assert not verdict.flags


@pytest.mark.slow
@pytest.mark.parametrize("stem", TIMER_HACKS)
def test_timer_tamper_is_rejected_at_runtime_while_every_core_is_busy(busy_cores, stem):
    verdict = judge("hacks", stem, static_checks=False)
    assert verdict.status is not Status.PASS and not verdict.correct, (stem, verdict.reason, verdict.flags)


@pytest.mark.slow
def test_rebound_timer_clocks_are_caught_by_the_judges_own_clocks(busy_cores):
    """The hack rebinds the runner's Timer clocks through gc (no module attribute changes, so the
    integrity snapshot sees nothing): only the judge's clocks can tell."""
    verdict = judge("hacks", "monkeypatch_timer_harness_internals", static_checks=False)
    assert verdict.status is Status.REJECTED and "timer_tamper" in verdict.flags, (verdict.reason, verdict.flags)


# -- the evidence itself ---------------------------------------------------------------------------
def test_waiting_reps_are_no_evidence():
    """An honest 1 ms call whose reps waited up to 50 ms for a core (the judge's wall clock grows,
    the candidate's reported time and CPU time do not) is not flagged, however the waits fall."""
    import random

    rng = random.Random(0)
    for _ in range(200):
        walls = [0.3 + 1.0 + rng.choice([0.0, rng.uniform(0, 50)]) for _ in range(30)]
        empties = [0.3 + rng.choice([0.0, rng.uniform(0, 50)]) for _ in range(8)]
        reported = [1.0 + rng.uniform(0, 0.05) for _ in walls]
        cpu = [1.1 + rng.uniform(0, 0.05) for _ in walls]
        empty_cpu = [0.1 + rng.uniform(0, 0.02) for _ in empties]
        assert tamper_evidence(reported, walls, empties, cpu, empty_cpu, n_cpus=1) is None


def test_a_clock_slowed_100x_is_evidence_by_wall_and_by_cpu_time():
    walls, empties = [0.3 + 10.0] * 20, [0.3] * 5
    assert "wall clock" in tamper_evidence([0.1] * 20, walls, empties)
    # every rep waited (the wall bound is useless), but the CPU time the process used still shows the work
    waited = [w + 40.0 for w in walls]
    assert tamper_evidence([0.1] * 20, waited, [e + 50.0 for e in empties]) is None
    found = tamper_evidence([0.1] * 20, waited, [e + 50.0 for e in empties], [10.1] * 20, [0.1] * 5, n_cpus=2)
    assert found and "CPU time over 2 core(s)" in found


def test_small_times_stay_inside_the_margin():
    tiny = [2 * PHYSICAL_FLOOR_MS] * 10
    assert tamper_evidence(tiny, [0.3 + 2 * TAMPER_MARGIN_MS] * 10, [0.3] * 5) is None
    assert tamper_evidence(tiny, [0.3] * 10, [0.3] * 5, [0.1 + 1.5 * TAMPER_CPU_MARGIN_MS] * 10, [0.1] * 5) is None
    assert tamper_evidence(tiny, [0.3] * 10, [0.3] * 5, [0.1 + 3 * TAMPER_CPU_MARGIN_MS] * 10, [0.1] * 5)


def test_a_stopped_clock_is_evidence_however_loaded_the_machine():
    """Below PHYSICAL_FLOOR_MS no call through the harness can report, even when every bound is lost in
    the noise of a loaded machine (the wall floor negative, CPU times all over the place)."""
    walls, empties = [5.0, 9.0, 3.0] * 10, [4.0, 8.0, 6.0] * 3
    assert "less than any call" in tamper_evidence([3e-8] * 30, walls, empties)
    assert tamper_evidence([2 * PHYSICAL_FLOOR_MS] * 30, walls, empties) is None


def test_the_calling_threads_cpu_time_is_a_bound_without_dividing_by_cores():
    """On a 16-core box the process bound divides by 16; one thread's CPU time cannot exceed its wall
    time, so it stays a bound. An honest call whose thread also pays for its outputs outside the timed
    window (1.7x its time, seen on a loaded machine) is not evidence; a clock slowed 10x is."""
    walls, empties = [1.0] * 40, [1.0] * 10  # the wall bound says nothing
    thread_empty = [0.05 + 0.001 * (i % 3) for i in range(10)]
    honest = tamper_evidence([0.2] * 40, walls, empties, n_cpus=16, thread_ms=[0.05 + 1.7 * 0.2] * 40,
                             empty_thread_ms=thread_empty)
    assert honest is None
    slowed = tamper_evidence([0.02] * 40, walls, empties, n_cpus=16, thread_ms=[0.05 + 0.2] * 40,
                             empty_thread_ms=thread_empty)
    assert slowed and "calling thread" in slowed
    # the same means with the thread's times spread wide: its noise widens the margin and nothing is claimed
    noisy = [0.05 + 0.2 + (0.4 if i % 2 else -0.2) for i in range(40)]
    assert tamper_evidence([0.02] * 40, walls, empties, n_cpus=16, thread_ms=noisy,
                           empty_thread_ms=[0.05 + (0.3 if i % 2 else 0.0) for i in range(10)]) is None
    assert TAMPER_THREAD_MARGIN_MS > 0


def test_a_threads_cpu_time_is_read_from_another_process():
    """The judge reads the candidate process's main thread from /proc (no clock_gettime for another
    process's thread): a child that spins for 0.3 s of CPU shows at least that much, one that sleeps does not."""
    code = "import sys, time\nsys.stdin.readline()\nt = time.thread_time()\nwhile time.thread_time() - t < 0.3:\n    pass\nprint('done', flush=True)\nsys.stdin.readline()\n"
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        clock = thread_cpu_clock(proc.pid)
        if clock is None:
            pytest.skip("this kernel's /proc has no schedstat")
        before = clock()
        proc.stdin.write("go\n")
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == "done"
        spun = clock() - before
        time.sleep(0.2)
        assert spun >= 0.29 and clock() - before - spun < 0.05
    finally:
        proc.kill()
        proc.wait()


# -- one lock per device, for every caller -------------------------------------------------------
def test_device_lock_is_the_machines_not_the_callers(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDAGYM_LOCK_DIR", str(tmp_path / "locks"))
    folder = prepare_lock_dir(lock_dir())
    assert folder == str(tmp_path / "locks") and (os.stat(folder).st_mode & 0o1777) == 0o1777
    assert device_lock_path(folder, "cpu") == str(tmp_path / "locks" / "cpu.lock")


def lock_waiters(path: str) -> int:
    """Processes blocked on a flock of this file (the `->` lines of /proc/locks)."""
    inode = f":{os.stat(path).st_ino} "
    return sum(1 for line in Path("/proc/locks").read_text().splitlines() if "->" in line and inode in line + " ")


def eval_one_waiting_for(path: str, locks: str) -> subprocess.Popen:
    """`cudagym eval one` of an honest CPU candidate in a process of its own, using the lock folder
    `locks`, once one process waits on the lock file `path` (which the caller holds alone)."""
    ref, cand = FIXTURES / "problems" / "add_scale.py", FIXTURES / "honest" / "add_scale_torch_add.py"
    cmd = [sys.executable, "-m", "cudagym", "eval", "one", "--ref", str(ref), "--candidate", str(cand),
           "--device", "cpu", "--policy", "permissive", "--json", "--n-checks", "2"]
    proc = subprocess.Popen(cmd, env=dict(os.environ, CUDAGYM_LOCK_DIR=locks), cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 180
    while not lock_waiters(path) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.5)
    assert lock_waiters(path) == 1, "nothing waited for the lock"
    return proc


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/locks").exists(), reason="needs /proc/locks")
def test_a_separate_eval_one_process_waits_for_the_machines_device_lock(tmp_path):
    """`cudagym eval one` in a process of its own takes the machine's lock of its device: while this
    test holds it alone, the other process waits on it (seen in /proc/locks); released, it passes."""
    locks = prepare_lock_dir(str(tmp_path / "locks"))
    path = device_lock_path(locks, "cpu")
    with gpu_lock(path, exclusive=True):
        proc = eval_one_waiting_for(path, locks)
        assert proc.poll() is None, "the eval one process never waited for the lock"
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    assert '"status": "pass"' in out, out


def judges_of(locks: str) -> list[int]:
    """Live judge processes started under this lock folder (their environment names it)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if b"cudagym.eval.judge" in cmdline and f"CUDAGYM_LOCK_DIR={locks}".encode() in environ:
            pids.append(int(entry.name))
    return pids


@pytest.mark.slow
def test_a_judge_killed_at_its_deadline_says_where_it_was(tmp_path):
    """A judge that ran out of time waiting for the device's lock (held here) reports that, not only
    that it ran out of time: a user under load learns what it waited for."""
    path = device_lock_path(prepare_lock_dir(str(tmp_path / "locks")), "cpu")
    ref, cand = (FIXTURES / "problems" / "add_scale.py").read_text(), (FIXTURES / "honest" / "add_scale_torch_add.py").read_text()
    with gpu_lock(path, exclusive=True):
        verdict = evaluate_candidate(ref, cand, EvalConfig(device="cpu", policy="permissive", n_checks=2, lock_path=path,
                                                           task_timeout_s=25))
    assert verdict.status is Status.TIMEOUT, verdict.reason
    assert "evaluation exceeded 25 s (the judge was waiting for the GPU lock for" in verdict.reason, verdict.reason


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/locks").exists(), reason="needs /proc/locks")
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL])
def test_an_interrupted_eval_one_stops_its_judge_and_says_where_it_was(tmp_path, sig):
    """Ctrl-C (or a caller's deadline: SIGINT) on `cudagym eval one` while its judge waits for the device:
    one line that says so, exit 130, and no judge left behind holding its place (the judge runs in a
    session of its own, out of reach of the terminal's signal). SIGKILL: no line, and still no judge
    left (it dies with its parent)."""
    locks = prepare_lock_dir(str(tmp_path / "locks"))
    path = device_lock_path(locks, "cpu")
    with gpu_lock(path, exclusive=True):
        proc = eval_one_waiting_for(path, locks)
        assert judges_of(locks), "the judge never waited for the lock"
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=60)
    if sig == signal.SIGINT:
        assert proc.returncode == 130, err
        assert err.strip().splitlines()[-1].startswith("cudagym: interrupted; its judge was waiting for the GPU lock for"), err
    time.sleep(0.5)
    assert judges_of(locks) == [], "a judge outlived its eval one"
