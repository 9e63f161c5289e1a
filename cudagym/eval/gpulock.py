"""One GPU, many judges: a readers-writer lock across processes (fcntl, writer preference), a
shared memory budget so that judges waiting for the GPU cannot starve each other of its memory, and
CPU cores kept for timing.

The lock and the ledger are the machine's, not a run's: one pair of files per device in `lock_dir()`
(a GPU named by its UUID), taken by every judge of every cudagym process on the host, whatever
started it (`eval one`, `eval run`, baselines, the filter, an agent's verify or profile, a Ray
worker). The CPU has a lock too: judges timing on the CPU take it alone.

Correctness checks may share the GPU (`shared`); timing may not (`exclusive`). A turnstile lock
makes a waiting timer block new readers, so timing is never starved by a stream of checks; with
CUDAGYM_GPU_LOCK_POLICY=writers-first, queued timers also go one after another before the readers
waiting for them, who then go together (`LOCK_POLICIES`: what each order costs).

The exclusive lock keeps the GPU quiet, not the host: a network of many small kernels is timed
mostly on the CPU that launches them, and on the H200 box other judges importing torch and
compiling moved such timings by up to 2x. So each GPU gets a few cores of its own
(`timing_cpu_split`): judges work on the rest, and the holder of the exclusive lock moves itself
and its candidate's process onto its GPU's timing cores while it times (`on_cpus`).

A candidate's build folder has a lock too (`build_folder_lock`): one build there at a time, and a
build that was killed leaves nothing that blocks the next.
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import json
import os
import time
from typing import Callable, Iterable


DEFAULT_LOCK_DIR = "/tmp/cudagym-locks"  # a fixed path, not $TMPDIR: every process of the machine must find it
# A file each hold of the GPU lock and of the memory budget is appended to, where set (off by default):
# one JSON line per hold, {"lock": "ex" | "sh" | "mem", "pid", "asked", "got", "released"} in wall-clock
# seconds ("gib" for the memory's). benchmarks/gpulock_trace.py says from it where a run's waits went.
TRACE_ENV = "CUDAGYM_GPU_LOCK_TRACE"


def lock_dir() -> str:
    """The machine's folder of device locks: every cudagym caller (`eval one`, `eval run`, baselines,
    the dataset filter, agent verify/profile, Ray workers of the host) takes its device's lock and
    memory ledger from here, so concurrent callers never time together or run each other out of
    memory. CUDAGYM_LOCK_DIR moves it (several machines sharing /tmp, tests)."""
    return os.environ.get("CUDAGYM_LOCK_DIR") or DEFAULT_LOCK_DIR


def prepare_lock_dir(path: str) -> str:
    """Create the folder (shared by every user of the machine: sticky and world-writable, like /tmp)."""
    os.makedirs(path, exist_ok=True)
    try:
        os.chmod(path, 0o1777)
    except OSError:  # another user's folder: theirs to set
        pass
    return path


def device_lock_path(folder: str, device: str) -> str:
    """The lock file of a device, named by what it is, not by its index: a GPU by its UUID (Ray
    workers and users with CUDA_VISIBLE_DEVICES number the same GPU differently), the CPU as `cpu`."""
    if not device.startswith("cuda"):
        return os.path.join(folder, "cpu.lock")
    import torch

    uuid = str(getattr(torch.cuda.get_device_properties(device), "uuid", "") or "")
    return os.path.join(folder, f"gpu-{uuid or torch.cuda.get_device_name(device).replace(' ', '_')}.lock")


# Who goes first among judges waiting for a GPU, per process (env CUDAGYM_GPU_LOCK_POLICY):
# - "turnstile" (default): a waiting timer blocks new readers, and takes the GPU when the readers in
#   it are done. When every judge alternates a shared phase (a build, a first call) with a timing turn,
#   as a probe wave's or a timing pass's judges do, each timer lets about one reader in ahead of it: the
#   phases run one after the other (a convoy; on the H100, session 27, a wave's judges waited ~400 of
#   ~430 judge-seconds and its wall time was the sum of every judge's phases).
# - "writers-first": timers queue (a shared flock on `<lock>.writers`), and a reader waits until the
#   queue is empty (at most READER_PATIENCE_S, then as with the turnstile): the queued timers go one
#   after another, then every waiting reader at once. Timing is as exclusive as before; only the order
#   differs. Measured on the CPU only so far (benchmarks/gpulock_convoy.py).
LOCK_POLICIES = ("turnstile", "writers-first")
# The longest a reader waits for a queue of timers to empty before it queues as with the turnstile: a
# timing turn is at most a few seconds (the harness's max_timing_s), so readers beside a stream of
# timers are delayed, never starved.
READER_PATIENCE_S = 10.0


def lock_policy() -> str:
    """This process's GPU lock policy (LOCK_POLICIES), from CUDAGYM_GPU_LOCK_POLICY."""
    policy = os.environ.get("CUDAGYM_GPU_LOCK_POLICY") or "turnstile"
    if policy not in LOCK_POLICIES:
        raise ValueError(f"CUDAGYM_GPU_LOCK_POLICY must be one of {', '.join(LOCK_POLICIES)}, got {policy!r}")
    return policy


@contextlib.contextmanager
def gpu_lock(path: str | None, exclusive: bool, policy: str | None = None):
    """Hold the device lock at `path` shared or exclusive; policy (None: `lock_policy()`) orders the waiters."""
    if not path:
        yield
        return
    asked, got = time.time(), None
    queue_fd = _open(path + ".writers") if (policy or lock_policy()) == "writers-first" else None
    turnstile_fd, data_fd = _open(path + ".turnstile"), _open(path)
    try:
        if queue_fd is not None:
            if exclusive:  # in the timers' queue until this turn ends
                fcntl.flock(queue_fd, fcntl.LOCK_SH)
            else:  # no timer queued (held while this reader gets in, so no timer slips in between)
                _flock_within(queue_fd, READER_PATIENCE_S, poll_s=0.005)
        fcntl.flock(turnstile_fd, fcntl.LOCK_EX)
        if exclusive:
            fcntl.flock(data_fd, fcntl.LOCK_EX)
            fcntl.flock(turnstile_fd, fcntl.LOCK_UN)
        else:
            fcntl.flock(turnstile_fd, fcntl.LOCK_UN)
            fcntl.flock(data_fd, fcntl.LOCK_SH)
            if queue_fd is not None:
                fcntl.flock(queue_fd, fcntl.LOCK_UN)
        got = time.time()
        yield
    finally:
        if got is not None:
            trace_hold("ex" if exclusive else "sh", asked, got)
        fcntl.flock(data_fd, fcntl.LOCK_UN)
        os.close(data_fd)
        os.close(turnstile_fd)
        if queue_fd is not None:
            os.close(queue_fd)  # drops its flock


def trace_hold(lock: str, asked: float, got: float, **more) -> None:
    """Append one hold, released now, to the trace file (`TRACE_ENV`), if set. One write of a line
    far below PIPE_BUF to a file opened for appending: lines of concurrent judges never interleave."""
    path = os.environ.get(TRACE_ENV)
    if not path:
        return
    line = json.dumps({"lock": lock, "pid": os.getpid(), "asked": round(asked, 4), "got": round(got, 4),
                       "released": round(time.time(), 4), **more}, separators=(",", ":"))
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
        try:
            os.write(fd, (line + "\n").encode())
        finally:
            os.close(fd)
    except OSError:  # a trace is never worth a judge's result
        pass


def _open(path: str) -> int:
    """Open for locking (flock needs no write access); created world-readable-writable when missing."""
    try:
        return os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        fd = os.open(path, os.O_RDONLY | os.O_CREAT, 0o666)
        _share(path)
        return fd


def _share(path: str) -> None:
    try:
        os.chmod(path, 0o666)  # the umask would keep other users' judges out
    except OSError:
        pass


@contextlib.contextmanager
def build_folder_lock(folder: str, timeout_s: float, poll_s: float = 0.2):
    """Hold a candidate's build folder (its TORCH_EXTENSIONS_DIR) alone among every process that
    builds there: an exclusive flock on `<folder>.building` beside it, waited for at most timeout_s
    (then TimeoutError). The sidecar is in the shared parent, which the candidate's process cannot write.

    torch guards a build with its FileBaton, a `<name>/lock` file made with O_EXCL and removed when the
    build ends: a build killed midway (a timeout, a SIGKILLed judge or rollout) leaves it behind, and
    every later import of that candidate waits on it until its own timeout. The flock is dropped by the
    kernel when its holder dies, and every builder of the folder holds it while it builds: so once it is
    held, no one else is building there and any baton left is a dead build's, removed here."""
    fd = _open(os.path.normpath(folder) + ".building")
    try:
        if not _flock_within(fd, timeout_s, poll_s):
            raise TimeoutError(f"another build of {os.path.basename(os.path.normpath(folder))} "
                               f"held its folder for {timeout_s:.0f} s")
        for baton in glob.glob(os.path.join(glob.escape(folder), "*", "lock")):
            with contextlib.suppress(OSError):  # one we cannot remove leaves its import waiting, as before
                os.unlink(baton)
        yield
    finally:
        os.close(fd)  # drops the flock


@contextlib.contextmanager
def compile_claim(folder: str, key: str, wait_s: float, poll_s: float = 0.5):
    """Who compiles a reference now, among the judges sharing `folder` (a machine's lock folder):
    an exclusive flock on `<folder>/compiles/<key>`. Yields whether this process holds it, after
    waiting for it at most wait_s (0: not at all). The kernel drops a killed judge's flock, so a claim
    never outlives its compile; the small files stay (one per problem compiled)."""
    fd = _open(os.path.join(prepare_lock_dir(os.path.join(folder, "compiles")), key))
    try:
        yield _flock_within(fd, wait_s, poll_s)
    finally:
        os.close(fd)  # drops the flock


@contextlib.contextmanager
def task_queue(folder: str):
    """A new, empty queue folder under `folder` (a machine's lock folder, which every judge may write):
    the judges of one pass, each given the whole list of its tasks, share them through it as one queue
    (`claim_task`): a judge takes the next task nobody has taken, so the pass ends when the list is
    done, not with the judge whose fixed share was slowest. Removed at the end."""
    import shutil
    import uuid

    path = os.path.join(prepare_lock_dir(os.path.join(folder, "queues")), uuid.uuid4().hex)
    os.makedirs(path)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def claim_task(queue: str, key: str, token: str) -> bool:
    """Take the task `key` of a queue for the judge whose token this is; False when another judge has it.
    The claim is a hard link of a file already holding the token: it appears whole or not at all, so
    whoever reads it (`task_claimant`) finds the token even when its judge died a moment after."""
    path = os.path.join(queue, key)
    mine = f"{path}.{os.getpid()}.tmp"
    with open(mine, "w") as f:
        f.write(token)
    try:
        os.link(mine, path)
        return True
    except FileExistsError:
        return False
    finally:
        os.unlink(mine)


def task_claimant(queue: str, key: str) -> str | None:
    """The token of the judge that took the task `key`, None while nobody has."""
    try:
        with open(os.path.join(queue, key)) as f:
            return f.read()
    except FileNotFoundError:
        return None


def _flock_within(fd: int, wait_s: float, poll_s: float) -> bool:
    """Take an exclusive flock on fd, trying every poll_s for at most wait_s; whether it was had."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(poll_s)


WAITING = "w"  # ledger keys "w<pid>": when that judge began to wait (ms, wall clock); a waiting judge holds no bytes
FAIR_AFTER_S = 30.0  # a judge that has waited this long is overtaken by nobody who came after it


class AdmissionDeferred(Exception):
    """memory_reservation gave up waiting (give_up_s): the caller does other work and comes back."""


@contextlib.contextmanager
def memory_reservation(path: str | None, n_bytes: int, budget_bytes: int, poll_s: float = 0.2,
                       free_bytes: Callable[[], int] | None = None, need_free_bytes: int = 0,
                       settle_s: float = 60.0, fair_after_s: float = FAIR_AFTER_S, give_up_s: float | None = None):
    """Reserve n_bytes of a GPU memory budget shared by concurrent judges (a JSON ledger of
    pid -> bytes under flock), waiting until it fits. A judge alone is always admitted, however
    large: the budget bounds concurrency, it does not refuse work. Entries of dead processes are
    dropped, so a killed judge frees its share. A judge holds nothing while it waits (its CUDA
    contexts are made once admitted, judge.Evaluation.reservation): on the H200 (session 10), entries
    that waiting judges held for their contexts kept large judges and whole-GPU reruns waiting on
    each other forever.

    Waiting judges are in the ledger too, with the time they began to wait and no bytes: once one has
    waited fair_after_s, no judge that began waiting after it is admitted before it, so the ledger
    drains as admitted judges finish and the large share fits. Without that, on the H200 (session 11,
    40 judges at once), two 100 GB judges waited 376 s, until killed, while dozens of small judges that
    came later were admitted one after another and the ledger never emptied enough.

    The ledger frees a share when its judge leaves the reservation, a moment before its process
    exits and the driver takes its memory back; a judge admitted in that moment ran out of memory.
    So where `free_bytes` (the device's free memory now) is given, admission also waits until
    need_free_bytes are free, for at most settle_s (memory held outside cudagym must not block it).
    settle_s counts from when the share first fits the ledger, not from when waiting began: a large
    judge waits long for the ledger, and then it most needs the device's memory to be given back.

    give_up_s: raise AdmissionDeferred after waiting that long, leaving no place in the queue; below
    fair_after_s, such a judge never holds back those that came after it."""
    if not path:
        yield
        return
    ledger = path + ".memory"
    key = str(os.getpid())
    wait_key = WAITING + key
    fits_since, waiting_since, asked = None, time.monotonic(), time.time()
    try:
        while True:
            with _locked_ledger(ledger) as entries:
                now_ms = int(time.time() * 1e3)
                since = entries.setdefault(wait_key, now_ms)
                held = {k: v for k, v in entries.items() if not k.startswith(WAITING)}
                others = [k for k in held if k != key]
                fits = not others or sum(held.values()) + n_bytes <= budget_bytes
                overtakes = any(k != wait_key and v < since and now_ms - v > fair_after_s * 1e3
                                for k, v in entries.items() if k.startswith(WAITING))
                fits = fits and not overtakes
                fits_since = (fits_since or time.monotonic()) if fits else None
                if fits and (free_bytes is None or time.monotonic() - fits_since > settle_s
                             or free_bytes() >= need_free_bytes):
                    entries[key] = n_bytes
                    del entries[wait_key]
                    break
            if give_up_s is not None and time.monotonic() - waiting_since >= give_up_s:
                raise AdmissionDeferred(f"{n_bytes / 2**30:.1f} GiB of GPU memory not free after {give_up_s:.0f} s")
            time.sleep(poll_s)
    except BaseException:  # stopped while waiting (Ctrl-C, a timeout): leave no place in the queue behind
        with _locked_ledger(ledger) as entries:
            entries.pop(wait_key, None)
        raise
    got = time.time()
    try:
        yield
    finally:
        with _locked_ledger(ledger) as entries:
            entries.pop(key, None)
        trace_hold("mem", asked, got, gib=round(n_bytes / 2**30, 3))


def lower_reservation(path: str | None, n_bytes: int) -> int | None:
    """Lower this process's share of the GPU memory budget to n_bytes, from inside its
    `memory_reservation`, for a stage that holds less than the one before (a filter judge's compile
    after its checks: one input set where the checks had three). Never raises a share: a judge that
    waited to grow its share while holding one could wait forever on others doing the same. The
    caller gives the memory back to the device first (torch.cuda.empty_cache): the ledger admits others
    into what it frees. Returns the share now held (None: no ledger, or no share of this process)."""
    if not path:
        return None
    key = str(os.getpid())
    with _locked_ledger(path + ".memory") as entries:
        if key not in entries:
            return None
        entries[key] = min(entries[key], int(n_bytes))
        return entries[key]


@contextlib.contextmanager
def _locked_ledger(path: str):
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    _share(path)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        raw = os.read(fd, 1 << 20)
        try:
            entries = {k: int(v) for k, v in json.loads(raw or b"{}").items()
                       if alive(int(k.removeprefix(WAITING).split(".")[0]))}
        except (ValueError, AttributeError):
            entries = {}
        yield entries
        os.lseek(fd, 0, os.SEEK_SET)
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps(entries).encode())
    finally:
        os.close(fd)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


TIMING_CPUS_PER_GPU = 2  # the judge and the candidate's process


def timing_cpu_split(gpu_index: int, n_gpus: int, cpus: Iterable[int]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(this GPU's timing cores, the cores every judge works on): TIMING_CPUS_PER_GPU cores per GPU
    from the top of `cpus`, the rest for work; ((), ()) (no pinning) where too few cores remain."""
    cpus = sorted(cpus)
    reserved = TIMING_CPUS_PER_GPU * n_gpus
    if not 0 <= gpu_index < n_gpus or len(cpus) < reserved + 2:
        return (), ()
    top = len(cpus) - TIMING_CPUS_PER_GPU * gpu_index
    return tuple(cpus[top - TIMING_CPUS_PER_GPU:top]), tuple(cpus[:len(cpus) - reserved])


def set_cpus(pid: int, cpus) -> None:
    """Pin every thread of process pid (CUDA launches may come from any of them) to cpus."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            os.sched_setaffinity(int(tid), cpus)
        except OSError:  # a thread that just ended
            pass


@contextlib.contextmanager
def on_cpus(pids: list[int], cpus):
    """Run processes pids on cpus for the block, then give back the cores each had."""
    if not cpus:
        yield
        return
    saved = {}
    for pid in pids:
        try:
            saved[pid] = os.sched_getaffinity(pid)
            set_cpus(pid, cpus)
        except OSError:  # gone, or not ours to move: it times where it is
            pass
    try:
        yield
    finally:
        for pid, old in saved.items():
            try:
                set_cpus(pid, old)
            except OSError:
                pass

