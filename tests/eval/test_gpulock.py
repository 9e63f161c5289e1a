"""GPU readers-writer lock across processes: readers share, a writer excludes, a waiting writer
blocks new readers (writer preference)."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from cudagym.eval import gpulock
from cudagym.eval.gpulock import LOCK_POLICIES, build_folder_lock, compile_claim, gpu_lock

REPO = str(Path(__file__).resolve().parents[2])

# Marks MARK.arrived, takes the lock, writes the monotonic time (system-wide clock) to MARK, holds it HOLD_S seconds.
HOLDER = textwrap.dedent("""
    import sys, time
    from cudagym.eval.gpulock import gpu_lock
    path, exclusive, mark, hold_s = sys.argv[1], sys.argv[2] == "1", sys.argv[3], float(sys.argv[4])
    open(mark + ".arrived", "w").close()  # about to ask for the lock
    with gpu_lock(path, exclusive=exclusive):
        with open(mark, "w") as f:
            f.write(repr(time.monotonic()))
        time.sleep(hold_s)
    print(repr(time.monotonic()))
""")


def start_holder(lock: str, exclusive: bool, mark: Path, hold_s: float = 0.0) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=REPO)
    return subprocess.Popen([sys.executable, "-c", HOLDER, lock, "1" if exclusive else "0", str(mark), str(hold_s)],
                            env=env, stdout=subprocess.PIPE, text=True)


def wait_for(path: Path, timeout_s: float = 20.0) -> float:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists() and path.read_text():
            return float(path.read_text())
        time.sleep(0.01)
    raise AssertionError(f"{path.name} never acquired the lock")


def finish(proc: subprocess.Popen) -> float:
    out, _ = proc.communicate(timeout=20)
    assert proc.returncode == 0
    return float(out.strip())


@pytest.fixture(params=LOCK_POLICIES)
def lock(tmp_path, request, monkeypatch) -> str:
    """A lock path; every holder of the test (this process, its children) under one of the policies."""
    monkeypatch.setenv("CUDAGYM_GPU_LOCK_POLICY", request.param)
    return str(tmp_path / "gpu.lock")


def test_no_path_is_a_no_op():
    with gpu_lock(None, exclusive=True):
        with gpu_lock("", exclusive=True):
            pass


def test_creates_lock_files(lock):
    with gpu_lock(lock, exclusive=False):
        assert os.path.exists(lock) and os.path.exists(lock + ".turnstile")


def test_two_readers_at_once(lock, tmp_path):
    first = start_holder(lock, False, tmp_path / "r1", hold_s=2.0)
    t1 = wait_for(tmp_path / "r1")
    second = start_holder(lock, False, tmp_path / "r2")
    t2 = wait_for(tmp_path / "r2")
    assert first.poll() is None  # the first reader still holds it
    finish(first)
    finish(second)
    assert t1 <= t2 < t1 + 2.0  # the second got in while the first held it


def test_writer_blocks_reader_until_released(lock, tmp_path):
    with gpu_lock(lock, exclusive=True):
        reader = start_holder(lock, False, tmp_path / "r")
        time.sleep(1.0)
        assert not (tmp_path / "r").exists(), "reader got in while the writer held the lock"
        released = time.monotonic()
    acquired = wait_for(tmp_path / "r")
    finish(reader)
    assert acquired >= released


def test_reader_blocks_writer_until_released(lock, tmp_path):
    with gpu_lock(lock, exclusive=False):
        writer = start_holder(lock, True, tmp_path / "w")
        time.sleep(1.0)
        assert not (tmp_path / "w").exists()
        released = time.monotonic()
    assert wait_for(tmp_path / "w") >= released
    finish(writer)


def test_waiting_writer_blocks_new_readers(lock, tmp_path):
    with gpu_lock(lock, exclusive=False):  # reader 1: here
        writer = start_holder(lock, True, tmp_path / "w", hold_s=0.5)
        time.sleep(0.7)  # the writer is now queued behind reader 1
        assert not (tmp_path / "w").exists()
        reader2 = start_holder(lock, False, tmp_path / "r2")
        time.sleep(1.0)
        # Without writer preference reader 2 would share with reader 1 right away.
        assert not (tmp_path / "r2").exists(), "a new reader overtook the waiting writer"
    t_writer = wait_for(tmp_path / "w")
    t_reader2 = wait_for(tmp_path / "r2")
    finish(writer)
    finish(reader2)
    assert t_reader2 >= t_writer + 0.45  # the writer went first and held it for its 0.5 s


def test_writers_first_lets_a_timer_that_queued_after_a_reader_go_before_it(tmp_path, monkeypatch):
    """Waiting in the order timer, reader, timer behind a holder: the turnstile alone serves them in that
    order, so the second timer waits for the reader's whole turn (with every judge alternating a shared
    phase and a timing turn, that is the convoy of benchmarks/gpulock_convoy.py); writers-first serves
    both timers, then the reader."""
    monkeypatch.setenv("CUDAGYM_GPU_LOCK_POLICY", "writers-first")
    lock = str(tmp_path / "gpu.lock")
    first = start_holder(lock, True, tmp_path / "w1", hold_s=6.0)
    wait_for(tmp_path / "w1")
    procs = [first]
    for name, exclusive in (("w2", True), ("r", False), ("w3", True)):
        procs.append(start_holder(lock, exclusive, tmp_path / name, hold_s=0.3))
        arrived = tmp_path / f"{name}.arrived"
        while not arrived.exists():
            time.sleep(0.01)
        time.sleep(0.3)  # waiting for the lock before the next arrives
    t = {name: wait_for(tmp_path / name) for name in ("w2", "r", "w3")}
    for proc in procs:
        finish(proc)
    assert t["w2"] < t["w3"] and t["r"] >= t["w3"] + 0.25  # the reader after the second timer's whole turn


def test_a_reader_waits_for_the_timers_queue_no_longer_than_its_patience(tmp_path, monkeypatch):
    lock = str(tmp_path / "gpu.lock")
    with gpu_lock(lock, exclusive=False, policy="writers-first"):  # creates the files
        pass
    monkeypatch.setattr(gpulock, "READER_PATIENCE_S", 0.5)
    queue = os.open(lock + ".writers", os.O_RDONLY)
    fcntl.flock(queue, fcntl.LOCK_SH)  # a timer that queued and never leaves
    try:
        t0 = time.monotonic()
        with gpu_lock(lock, exclusive=False, policy="writers-first"):
            waited = time.monotonic() - t0
    finally:
        os.close(queue)
    assert 0.4 <= waited < 5.0


MEMORY_HOLDER = """
import sys, time
from cudagym.eval.gpulock import memory_reservation
path, n, hold, marker = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
fair_after_s = float(sys.argv[5]) if len(sys.argv) > 5 else 30.0
t0 = time.time()
with memory_reservation(path, n, budget_bytes=100, poll_s=0.05, fair_after_s=fair_after_s):
    open(marker, "w").write(f"{time.time()} {t0}")
    time.sleep(hold)
"""


def hold_in_child(lock: str, path) -> subprocess.Popen:
    """A child process that enters `with gpulock.<lock>:`, prints what it yielded and holds it for 60 s."""
    code = ("import sys, time\nfrom cudagym.eval.gpulock import build_folder_lock, compile_claim\n"
            f"with {lock}:\n    print(held, flush=True)\n    time.sleep(60)\n")
    return subprocess.Popen([sys.executable, "-c", code, str(path)], env=dict(os.environ, PYTHONPATH=REPO),
                            stdout=subprocess.PIPE, text=True)


def test_a_build_folder_has_one_builder_and_its_holder_clears_dead_builds_batons(tmp_path):
    """torch's batons (`<ext>/lock`, exactly one level down) go when the folder is taken, nothing else;
    a second builder waits and gives up at its timeout; a killed holder's flock is gone with it."""
    folder = tmp_path / "candidate-0123"
    (folder / "ext" / "deeper").mkdir(parents=True)
    for name in ("ext/lock", "ext/deeper/lock", "ext/lock.o", "lock"):
        (folder / name).write_text("")
    holder = hold_in_child("build_folder_lock(sys.argv[1], 10) as held", folder)
    try:
        assert holder.stdout.readline() == "None\n"  # build_folder_lock yields nothing: held once it prints
        assert sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()) == \
            ["ext/deeper/lock", "ext/lock.o", "lock"]
        assert (tmp_path / "candidate-0123.building").exists()
        t0 = time.monotonic()
        with pytest.raises(TimeoutError, match="another build of candidate-0123"):
            with build_folder_lock(str(folder), timeout_s=0.5):
                pass
        assert time.monotonic() - t0 >= 0.5
    finally:
        holder.kill()
        holder.wait()
    with build_folder_lock(str(folder), timeout_s=5):
        pass


def test_a_compile_claim_has_one_holder_others_skip_or_wait_and_a_killed_holder_frees_it(tmp_path):
    """A baseline run's judges claim a problem while they compile it: with no wait the claim is
    refused while another process holds it; with a wait it is had once that process is gone."""
    holder = hold_in_child("compile_claim(sys.argv[1], 'k1', 0) as held", tmp_path)
    try:
        assert holder.stdout.readline() == "True\n"
        with compile_claim(str(tmp_path), "k1", wait_s=0) as held:
            assert held is False
        with compile_claim(str(tmp_path), "k2", wait_s=0) as held:  # another problem is free
            assert held is True
        t0 = time.monotonic()
        with compile_claim(str(tmp_path), "k1", wait_s=0.6, poll_s=0.1) as held:
            assert held is False and time.monotonic() - t0 >= 0.6
        killer = subprocess.Popen(["sh", "-c", f"sleep 0.5; kill -9 {holder.pid}"])
        t0 = time.monotonic()
        with compile_claim(str(tmp_path), "k1", wait_s=30, poll_s=0.1) as held:
            assert held is True and 0.3 < time.monotonic() - t0 < 20
        killer.wait()
    finally:
        holder.kill()
        holder.wait()
    assert oct((tmp_path / "compiles").stat().st_mode & 0o7777) == "0o1777"  # shared like the lock folder


def test_memory_reservations_that_do_not_fit_together_run_one_after_the_other(tmp_path):
    lock = str(tmp_path / "gpu.lock")
    first = subprocess.Popen([sys.executable, "-c", MEMORY_HOLDER, lock, "60", "1.0", str(tmp_path / "a")])
    time.sleep(0.4)  # the first holds 60 of 100
    t_start = time.time()
    second = subprocess.run([sys.executable, "-c", MEMORY_HOLDER, lock, "60", "0", str(tmp_path / "b")], timeout=30)
    first.wait(timeout=30)
    assert second.returncode == 0 and first.returncode == 0
    admitted_second = float((tmp_path / "b").read_text().split()[0])
    admitted_first = float((tmp_path / "a").read_text().split()[0])
    assert admitted_second >= admitted_first + 0.9, "the second was admitted while the first still held its share"
    assert admitted_second > t_start


LOWERING_HOLDER = """
import sys, time
from cudagym.eval.gpulock import lower_reservation, memory_reservation
path, marker = sys.argv[1], sys.argv[2]
with memory_reservation(path, 60, budget_bytes=100, poll_s=0.05):
    time.sleep(0.8)
    raised = lower_reservation(path, 80)  # a share is never raised
    lowered = lower_reservation(path, 20)
    open(marker, "w").write(f"{time.time()} {raised} {lowered}")
    time.sleep(1.5)
"""


def test_a_lowered_reservation_admits_others_into_what_it_freed_and_is_never_raised(tmp_path):
    """A judge holding 60 of 100 lowers its share to 20 (its compile after its checks): a judge of 60
    waiting beside it is admitted then, while the first still holds its 20; asked for 80 it keeps 60."""
    lock = str(tmp_path / "gpu.lock")
    first = subprocess.Popen([sys.executable, "-c", LOWERING_HOLDER, lock, str(tmp_path / "a")],
                             env=dict(os.environ, PYTHONPATH=REPO))
    time.sleep(0.4)  # the first holds 60 of 100
    second = subprocess.run([sys.executable, "-c", MEMORY_HOLDER, lock, "60", "0", str(tmp_path / "b")], timeout=30,
                            env=dict(os.environ, PYTHONPATH=REPO))
    admitted_second = time.time()
    assert second.returncode == 0
    lowered_at, raised, lowered = (tmp_path / "a").read_text().split()
    assert (raised, lowered) == ("60", "20")
    assert float((tmp_path / "b").read_text().split()[0]) >= float(lowered_at)  # not before the first lowered
    assert first.poll() is None, "the second waited for the first to end, not for its lowered share"
    first.wait(timeout=30)
    assert first.returncode == 0 and admitted_second < time.time()
    from cudagym.eval.gpulock import lower_reservation
    assert lower_reservation(lock, 1) is None  # outside any reservation of its own, a process lowers nothing


def test_a_reservation_that_fits_is_admitted_at_once_and_a_dead_holder_frees_its_share(tmp_path):
    lock = str(tmp_path / "gpu.lock")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (tmp_path / "gpu.lock.memory").write_text(json.dumps({str(dead.pid): 90}))  # left by a killed judge
    t0 = time.time()
    subprocess.run([sys.executable, "-c", MEMORY_HOLDER, lock, "60", "0", str(tmp_path / "c")], timeout=30, check=True)
    assert float((tmp_path / "c").read_text().split()[0]) - t0 < 5
    assert json.loads((tmp_path / "gpu.lock.memory").read_text()) == {}


def test_admission_waits_for_memory_a_finished_judge_has_not_given_back_yet(tmp_path):
    """The ledger is empty, but the device's memory is still held (a judge that left its reservation
    and has not exited yet): admission waits until enough is free, and no longer than settle_s."""
    from cudagym.eval.gpulock import memory_reservation

    lock = str(tmp_path / "gpu.lock")
    released_at = time.monotonic() + 0.6

    def free_bytes() -> int:
        return 100 if time.monotonic() >= released_at else 10

    with memory_reservation(lock, 60, 100, poll_s=0.05, free_bytes=free_bytes, need_free_bytes=60):
        admitted = time.monotonic()
    assert admitted >= released_at
    t0 = time.monotonic()
    with memory_reservation(lock, 60, 100, poll_s=0.05, free_bytes=lambda: 0, need_free_bytes=60, settle_s=0.3):
        held_elsewhere = time.monotonic() - t0  # memory held outside cudagym: admitted after settle_s
    assert 0.3 <= held_elsewhere < 5
    assert json.loads((tmp_path / "gpu.lock.memory").read_text()) == {}


def test_a_judge_that_waited_long_for_the_ledger_still_waits_for_the_memory_to_be_given_back(tmp_path):
    """Session 4 on the H200: L1/52 (a 98 GB share) waited over a minute for the ledger; when the
    ledger freed, its settle time was already spent, it skipped the free-memory check and ran out of
    memory beside a finished judge's 85 GB. The settle time starts when the share fits."""
    from cudagym.eval.gpulock import memory_reservation

    lock = str(tmp_path / "gpu.lock")
    holder = subprocess.Popen([sys.executable, "-c", MEMORY_HOLDER, lock, "90", "0.8", str(tmp_path / "h")])
    while not (tmp_path / "h").exists():
        time.sleep(0.02)
    ledger_freed = float((tmp_path / "h").read_text().split()[0]) + 0.8
    give_back_s = 0.5  # the holder's memory comes back this long after it left the ledger

    def free_bytes() -> int:
        return 100 if time.time() >= ledger_freed + give_back_s else 10

    with memory_reservation(lock, 60, 100, poll_s=0.05, free_bytes=free_bytes, need_free_bytes=60, settle_s=0.3):
        admitted = time.time()
    holder.wait(timeout=30)
    # waited 0.8 s (> settle_s) for the ledger; then 0.3 s more, not 0, for the device
    assert admitted >= ledger_freed + 0.25


def test_each_gpu_gets_its_own_timing_cores_and_judges_work_on_the_rest():
    from cudagym.eval.gpulock import timing_cpu_split

    cpus = list(range(32))
    assert timing_cpu_split(0, 2, cpus) == ((30, 31), tuple(range(28)))
    assert timing_cpu_split(1, 2, cpus) == ((28, 29), tuple(range(28)))
    assert timing_cpu_split(0, 1, [5, 1, 3, 7, 2]) == ((5, 7), (1, 2, 3))  # the cores this process may use
    assert timing_cpu_split(0, 2, [0, 1, 2, 3, 4]) == ((), ())  # too few left to work on: no pinning
    assert timing_cpu_split(2, 2, cpus) == ((), ())


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores to move a process between")
def test_a_process_times_on_the_given_cores_and_gets_its_own_back():
    from cudagym.eval.gpulock import on_cpus

    mine = sorted(os.sched_getaffinity(0))
    child = subprocess.Popen([sys.executable, "-c", "import threading, time\n"
                              "threading.Thread(target=time.sleep, args=(30,), daemon=True).start()\ntime.sleep(30)"])
    try:
        time.sleep(0.5)
        os.sched_setaffinity(child.pid, mine[:1])
        threads = [int(t) for t in os.listdir(f"/proc/{child.pid}/task")]
        assert len(threads) == 2
        with on_cpus([child.pid, os.getpid()], mine[-1:]):
            assert all(os.sched_getaffinity(t) == set(mine[-1:]) for t in threads)  # every thread moved
            assert os.sched_getaffinity(0) == set(mine[-1:])
        assert all(os.sched_getaffinity(t) == set(mine[:1]) for t in threads)
        assert os.sched_getaffinity(0) == set(mine)
    finally:
        child.kill()
        os.sched_setaffinity(0, mine)


def test_a_judge_alone_is_admitted_however_large_and_others_wait(tmp_path):
    """Alone, a judge is admitted even past the budget; while it holds its share, another process's
    reservation waits; its entry goes when it leaves."""
    from cudagym.eval.gpulock import memory_reservation

    lock = str(tmp_path / "gpu.lock")
    with memory_reservation(lock, 150, budget_bytes=100, poll_s=0.05):  # more than the budget: alone, admitted
        entries = json.loads((tmp_path / "gpu.lock.memory").read_text())
        assert entries == {str(os.getpid()): 150}
        other = subprocess.Popen([sys.executable, "-c", MEMORY_HOLDER, lock, "10", "0", str(tmp_path / "d")])
        time.sleep(1.0)
        assert other.poll() is None and not (tmp_path / "d").exists(), "admitted beside a full ledger"
    other.wait(timeout=30)
    assert other.returncode == 0
    assert json.loads((tmp_path / "gpu.lock.memory").read_text()) == {}


LARGE_JUDGE = """
import sys, time
from cudagym.eval.gpulock import memory_reservation
path, work, marker = sys.argv[1], int(sys.argv[2]), sys.argv[3]
with memory_reservation(path, work, budget_bytes=100, poll_s=0.05):
    start = time.time()
    time.sleep(0.3)
    open(marker, "w").write(f"{start} {time.time()}")
"""


@pytest.mark.parametrize("work", [70, 100])  # 100: the whole budget (a rerun after an OOM)
def test_large_judges_waiting_at_once_are_admitted_in_turn(tmp_path, work):
    """The H200, session 10: large judges and whole-GPU reruns after an OOM, several waiting at once,
    none of which fits beside another: each is admitted in turn, one at a time, and none waits forever."""
    lock = str(tmp_path / "gpu.lock")
    procs = [subprocess.Popen([sys.executable, "-c", LARGE_JUDGE, lock, str(work), str(tmp_path / f"j{i}")])
             for i in range(3)]
    for p in procs:
        assert p.wait(timeout=60) == 0
    spans = sorted(tuple(map(float, (tmp_path / f"j{i}").read_text().split())) for i in range(3))
    for (_, end), (start, _) in zip(spans, spans[1:]):
        assert start >= end - 0.05, "two working shares that do not fit together were held at once"
    assert json.loads((tmp_path / "gpu.lock.memory").read_text()) == {}


SMALL_STREAM = """
import subprocess, sys, time
holder, lock, seconds, fair_after_s = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
procs, end = [], time.time() + seconds
while time.time() < end:  # a new small judge every 0.2 s, each holding 20 of 100 for 1 s: the ledger never drains
    procs.append(subprocess.Popen([sys.executable, "-c", holder, lock, "20", "1.0", "/dev/null", fair_after_s]))
    time.sleep(0.2)
for p in procs:
    p.wait()
"""


def test_a_large_judge_is_not_starved_by_a_stream_of_small_ones(tmp_path):
    """The H200, session 11: two 100 GB judges waited 376 s while dozens of small judges that came later
    were admitted one after another. Once a judge has waited fair_after_s, nobody who came after it goes
    first: the ledger drains and it is admitted, long before the stream of small judges ends."""
    lock = str(tmp_path / "gpu.lock")
    stream = subprocess.Popen([sys.executable, "-c", SMALL_STREAM, MEMORY_HOLDER, lock, "10", "0.5"])
    time.sleep(2.0)  # the stream is under way: several small shares held at any time
    large = subprocess.run([sys.executable, "-c", MEMORY_HOLDER, lock, "90", "0.3", str(tmp_path / "large"), "0.5"],
                           timeout=60)
    stream_still_running = stream.poll() is None
    stream.wait(timeout=60)
    assert large.returncode == 0 and stream.returncode == 0
    admitted, began = map(float, (tmp_path / "large").read_text().split())
    assert stream_still_running, "the large judge was admitted only once the stream of small ones ended"
    assert admitted - began < 5.0  # fair_after_s 0.5, then the held shares end within their 1 s
    assert json.loads((tmp_path / "gpu.lock.memory").read_text()) == {}


def test_a_rerun_after_running_out_of_memory_waits_for_the_whole_budget_free():
    """A judge reserves its footprint and waits for that much free device memory; its rerun after an
    OOM (its footprint was too small once) reserves the whole budget and waits until the device has it
    free, not only the footprint (session 12: a 100 GB estimate for a judge that needs ~120 GB)."""
    from cudagym.eval.judge import memory_share

    gb = 2**30
    assert memory_share(100 * gb, 118 * gb, exclusive=False) == (100 * gb, 100 * gb)
    assert memory_share(100 * gb, 118 * gb, exclusive=True) == (118 * gb, 118 * gb)
    assert memory_share(200 * gb, 118 * gb, exclusive=False) == (200 * gb, 118 * gb)  # alone, at most the budget


def test_a_reference_compile_holds_the_shared_lock_only_while_autotuning(lock, tmp_path, monkeypatch):
    """A baseline judge compiles outside the GPU lock (a timer waits for no compile's codegen), but
    the Triton autotuner's benchmarks run on the GPU: they take the shared lock, so they wait for a
    timing turn and a timer waits for them. The patch is undone when the compile ends."""
    import threading

    from torch._inductor.runtime.triton_heuristics import CachingAutotuner

    from cudagym.eval.judge import Request, autotuning_locked

    ran = []
    monkeypatch.setattr(CachingAutotuner, "benchmark_all_configs", lambda self, *a, **k: ran.append(time.monotonic()) or "best")
    original = CachingAutotuner.benchmark_all_configs
    req = Request(mode="baseline", ref_code="", workdir=str(tmp_path), device="cuda:0", lock_path=lock)
    timer = start_holder(lock, True, tmp_path / "timer", hold_s=1.5)  # a timing turn under way
    turn_began = wait_for(tmp_path / "timer")
    answers = []
    with autotuning_locked(req):
        assert CachingAutotuner.benchmark_all_configs is not original
        tuning = threading.Thread(target=lambda: answers.append(CachingAutotuner.benchmark_all_configs(object())))
        tuning.start()
        time.sleep(0.5)
        assert not ran, "autotuning benchmarked during a timing turn"
        finish(timer)
        tuning.join(20)
    assert answers == ["best"] and ran[0] >= turn_began + 1.5  # not before the turn's end
    assert CachingAutotuner.benchmark_all_configs is original
    with autotuning_locked(Request(mode="baseline", ref_code="", workdir=str(tmp_path), device="cpu", lock_path=lock)):
        assert CachingAutotuner.benchmark_all_configs is original  # the CPU: nothing to lock


def test_a_reservation_that_gives_up_leaves_no_place_in_the_queue_and_holds_back_nobody(tmp_path):
    """give_up_s: a large share that does not fit is deferred after that long (the baseline run's timing
    judge then times its other problems), and its waiting entry goes, so a judge that came after it and
    fits is admitted, however long the large one would have waited."""
    from cudagym.eval.gpulock import AdmissionDeferred, memory_reservation

    lock = str(tmp_path / "gpu.lock")
    holder = subprocess.Popen([sys.executable, "-c", MEMORY_HOLDER, lock, "40", "30", str(tmp_path / "a"), "0.1"])
    try:
        deadline = time.time() + 30
        while not (tmp_path / "a").exists() and time.time() < deadline:
            time.sleep(0.05)
        t0 = time.monotonic()
        with pytest.raises(AdmissionDeferred, match="not free after 1 s"):
            with memory_reservation(lock, 90, budget_bytes=100, poll_s=0.05, fair_after_s=0.1, give_up_s=1.0):
                pytest.fail("admitted beside a holder it does not fit with")
        assert 1.0 <= time.monotonic() - t0 < 10
        assert json.loads((tmp_path / "gpu.lock.memory").read_text()) == {str(holder.pid): 40}
        # had it stayed in the queue past fair_after_s, this one (which fits) would wait behind it
        subprocess.run([sys.executable, "-c", MEMORY_HOLDER, lock, "50", "0", str(tmp_path / "b"), "0.1"],
                       timeout=10, check=True)
    finally:
        holder.kill()
        holder.wait()


TRACED_JUDGE = """
import sys, time
from cudagym.eval.gpulock import gpu_lock, memory_reservation
lock, policy = sys.argv[1], sys.argv[2]
with memory_reservation(lock, 3 << 30, 4 << 30, poll_s=0.01):  # two of these never fit together
    for _ in range(3):
        with gpu_lock(lock, exclusive=False, policy=policy):
            time.sleep(0.05)
        with gpu_lock(lock, exclusive=True, policy=policy):
            time.sleep(0.02)
"""


def _trace_report():
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpulock_trace", Path(__file__).parents[2] / "benchmarks" / "gpulock_trace.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("policy", LOCK_POLICIES)
def test_a_traced_run_records_every_hold_and_no_timing_turn_overlaps_another_hold(tmp_path, policy):
    """CUDAGYM_GPU_LOCK_TRACE: each judge's holds of the GPU lock and of the memory budget, one line each
    from concurrent processes; the trace shows the lock's promise (an exclusive hold overlaps no other
    hold, two memory shares that do not fit never overlap), and benchmarks/gpulock_trace.py splits the
    span into the lock's states."""
    lock, trace = str(tmp_path / "gpu.lock"), tmp_path / "trace.jsonl"
    env = {**os.environ, gpulock.TRACE_ENV: str(trace)}
    judges = [subprocess.Popen([sys.executable, "-c", TRACED_JUDGE, lock, policy], env=env) for _ in range(3)]
    assert [p.wait(timeout=60) for p in judges] == [0, 0, 0]
    tool = _trace_report()
    events = tool.read_trace(trace)
    assert sorted(e["lock"] for e in events) == ["ex"] * 9 + ["mem"] * 3 + ["sh"] * 9
    assert all(e["asked"] <= e["got"] <= e["released"] for e in events)
    gpu = [e for e in events if e["lock"] != "mem"]
    for ex in (e for e in gpu if e["lock"] == "ex"):
        assert not [o for o in gpu if o is not ex and o["got"] < ex["released"] and ex["got"] < o["released"]]
    mem = sorted((e for e in events if e["lock"] == "mem"), key=lambda e: e["got"])
    assert all(a["released"] <= b["got"] for a, b in zip(mem, mem[1:]))  # one judge admitted at a time
    summary = tool.summarize(events)
    assert sum(summary["states"].values()) == pytest.approx(summary["span_s"], rel=1e-6)
    assert summary["states"]["exclusive"] >= 9 * 0.02 and summary["states"]["shared"] >= 3 * 0.05
    assert summary["states"]["idle, waiting for memory"] > 0  # two judges wait while the third runs its holds
    assert summary["holds"]["ex"]["n"] == 9 and summary["holds"]["mem"]["pids"] == 3
    assert summary["memory"]["admitted_max"] == 1 and summary["memory"]["reserved_gib_max"] == pytest.approx(3.0)
    text = tool.report(summary)
    assert "| exclusive |" in text and "Memory budget: " in text
    starts, shares = tool.timeline(events, bins=10)  # the same split, bin by bin
    # (wall-clock seconds near 1.8e9 carry ~1e-7 s of rounding each, against bins of tens of ms)
    assert len(starts) == 10 and all(sum(s[i] for s in shares.values()) == pytest.approx(1.0, abs=1e-3) for i in range(10))
    assert sum(shares["exclusive"]) * summary["span_s"] / 10 == pytest.approx(summary["states"]["exclusive"], rel=1e-3)
    assert tool.main([str(trace), "--plot", str(tmp_path / "lock.png")]) == 0
    assert (tmp_path / "lock.png").read_bytes()[:4] == b"\x89PNG"
    assert tool.main([str(tmp_path / "missing.jsonl")]) == 2


def test_the_trace_report_says_how_long_readers_kept_a_waiting_timer_out():
    """A drain: readers hold the lock while a timer waits for it. Reader a holds 0-2 s, reader b 0.2-1 s; the
    timer asks at 0.5 s and gets the lock at 2 s: a drain of 1.5 s, 1 s of it with reader a alone."""
    tool = _trace_report()
    t = 1_800_000_000.0
    events = [{"lock": "sh", "pid": 1, "asked": t, "got": t, "released": t + 2.0},
              {"lock": "sh", "pid": 2, "asked": t + 0.2, "got": t + 0.2, "released": t + 1.0},
              {"lock": "ex", "pid": 3, "asked": t + 0.5, "got": t + 2.0, "released": t + 2.1}]
    summary = tool.summarize(events)
    assert summary["drain_s"] == pytest.approx(1.5, abs=1e-6)
    assert summary["drain_one_reader_s"] == pytest.approx(1.0, abs=1e-6)
    assert summary["states"]["shared"] == pytest.approx(2.0, abs=1e-6)  # a drain is shared time, split further
    assert "Drains (readers hold the lock while a timer waits for it): 1.5 s, 71.4% of the span; 1.0 s" in tool.report(summary)
    assert tool.summarize([])["drain_s"] == 0.0


def test_without_the_trace_setting_nothing_is_written(tmp_path, monkeypatch):
    monkeypatch.delenv(gpulock.TRACE_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    with gpu_lock(str(tmp_path / "gpu.lock"), exclusive=True, policy="turnstile"):
        pass
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gpu.lock", "gpu.lock.turnstile"]


def test_a_sandboxed_judge_writes_its_holds_to_the_trace(tmp_path, monkeypatch):
    """A real judge (the dataset filter's, on the CPU, whose timing takes the CPU's lock alone) runs with
    a file system read-only but for its workdir, caches and the folders it is given: the trace's folder
    is one of them, so its holds reach the trace."""
    from cudagym.synth.filter import FilterConfig, filter_tasks
    from cudagym.tasks import Task

    trace = tmp_path / "traces" / "gpulock.jsonl"
    trace.parent.mkdir()
    monkeypatch.setenv(gpulock.TRACE_ENV, str(trace))
    code = textwrap.dedent('''
        import torch
        import torch.nn as nn

        class Model(nn.Module):
            def forward(self, x):
                return torch.tanh(x) * 2 + x

        def get_inputs():
            return [torch.randn(64, 64)]

        def get_init_inputs():
            return []
        ''')
    kept, rejects, _ = filter_tasks([Task(id="t", name="t", code=code, source="test")],
                                    FilterConfig(device="cpu", parallel=1, task_timeout_s=120.0, min_eager_ms=0.0))
    assert len(kept) == 1, rejects
    locks = [json.loads(line)["lock"] for line in trace.read_text().splitlines()]
    assert "ex" in locks  # its timing turn
