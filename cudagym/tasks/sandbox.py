"""Process isolation for untrusted code (tasks, candidates, agent commands).

The child calls `isolate()` first thing, before it imports anything heavy (a mount namespace only
covers the thread that asks, so the process must still be single-threaded):
- no network: a fresh network namespace with no interfaces (not even loopback up);
- no writes outside its workdir: a private mount namespace where every mount is read-only except
  the workdir, the shared build caches, /dev/shm and the kernel's pseudo file systems.
The parent enforces time (it kills on timeout) and memory (`MemoryWatchdog` polls the child's RSS;
RLIMIT_AS would break CUDA, which reserves huge virtual ranges). Standard library only: this runs
on GPU boxes that have nothing but torch.
"""

from __future__ import annotations

import ctypes
import os
import signal
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from cudagym.tasks.confine import (CLONE_NEWNET, CLONE_NEWNS, CLONE_NEWUSER, CONFINE_FAILED, CONFINE_PREFIX,  # noqa: F401
                                   MS_BIND, MS_PRIVATE, MS_RDONLY, MS_REC, MS_REMOUNT, PR_SET_NO_NEW_PRIVS, PR_SET_PDEATHSIG,
                                   check_rc,
                                   load_libc, pseudo_fs)


def _enter_namespaces(libc) -> None:
    if os.geteuid() == 0:
        check_rc(libc.unshare(CLONE_NEWNS | CLONE_NEWNET), "unshare")
        return
    # Unprivileged: a user namespace grants the mount/net capabilities inside it only.
    uid, gid = os.getuid(), os.getgid()
    check_rc(libc.unshare(CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWNET), "unshare(user)")
    Path("/proc/self/setgroups").write_text("deny")
    Path("/proc/self/uid_map").write_text(f"{uid} {uid} 1")
    Path("/proc/self/gid_map").write_text(f"{gid} {gid} 1")


def isolate(workdir: str | Path, writable: list[str | Path] = ()) -> str:
    """Cut the network and make the file system read-only except `workdir` and `writable`.

    Returns "full" on success or "partial: <why>"; the caller records it in the verdict's env so a
    run on a machine without namespaces is visible as such, instead of failing outright.
    """
    libc = load_libc()
    keep = [str(Path(p).resolve()) for p in [workdir, *writable] if p]
    try:
        _enter_namespaces(libc)
        check_rc(libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "make / private")
        for path in keep:
            Path(path).mkdir(parents=True, exist_ok=True)
            check_rc(libc.mount(path.encode(), path.encode(), None, MS_BIND | MS_REC, None), f"bind {path}")
        mounts = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()]
        for mount in mounts:
            mount = mount.replace("\\040", " ")
            if mount in keep or pseudo_fs(mount):
                continue
            # Some mounts (already read-only, locked in a user namespace) refuse; that leaves them as they were.
            libc.mount(None, mount.encode(), None, MS_REMOUNT | MS_BIND | MS_RDONLY, None)
        if os.access("/", os.W_OK) and _root_writable():
            return "partial: root file system still writable"
        return "full"
    except OSError as e:
        return f"partial: {e.strerror or e}"


PR_CAPBSET_DROP, PR_SET_SECUREBITS = 24, 28
# uid 0 gains no capability by exec, and none can be raised again (the bits are locked)
SECUREBITS_NO_ROOT = sum(1 << b for b in (0, 1, 2, 3, 6, 7))  # NOROOT, NO_SETUID_FIXUP, NO_CAP_AMBIENT_RAISE + locks
CAPABILITY_VERSION_3 = 0x20080522


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def die_with_parent(parent_pid: int) -> None:
    """SIGKILL this process as soon as `parent_pid`, the process that started it, ends. A judge runs
    its candidate in a session of its own (so it can kill the candidate's compilers with it), which
    the judge's own killers (a stopped batch, a timeout) do not reach: without this, a candidate
    stuck in its import or build would outlive its judge."""
    check_rc(load_libc().prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "pdeathsig")
    if os.getppid() != parent_pid:  # the parent ended before the line above
        os._exit(1)


def session_members(sid: int) -> list[int]:
    """The live processes of session `sid` (from /proc: field 6 of each stat)."""
    pids = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/stat") as f:
                    if int(f.read().rpartition(")")[2].split()[3]) == sid:
                        pids.append(int(entry.name))
            except (OSError, ValueError, IndexError):
                continue
    return pids


def kill_session_when_gone() -> None:
    """Fork a watcher that SIGKILLs every process of this process's session the moment this process
    ends, however it ends. A judge's candidate process leads a session of its own, and the compilers
    its build starts (ninja, the compiler driver, cc1plus, nvcc) stay in it, each command in a process
    group of its own (ninja's doing): die_with_parent's SIGKILL ends only the process itself, and a
    kill of its group misses them, so a judge killed mid-build left them compiling on for tens of
    seconds beside the judges after it. The watcher waits on a pipe whose write end only this process
    holds (a pipe's fds are not inherited by exec): its read returns when this process (and any fork
    of it) has died. It has a group of its own, so a kill of this process's group leaves it to sweep."""
    leader = os.getpid()
    if os.getsid(0) != leader:  # another's session (the judge's): never swept from here
        return
    read_end, write_end = os.pipe()
    if os.fork():
        os.close(read_end)  # write_end stays open, unused, for this process's whole life
        return
    try:
        os.setpgid(0, 0)
        os.closerange(3, read_end)  # the judge's socket among them: its EOF must not wait for the watcher
        os.closerange(read_end + 1, os.sysconf("SC_OPEN_MAX"))
        while os.read(read_end, 1):
            pass
        for _ in range(5):  # a process forked while the sweep ran is caught by the next
            left = [pid for pid in session_members(leader) if pid != os.getpid()]
            if not left:
                break
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
    finally:
        os._exit(0)


def drop_capabilities() -> str | None:
    """Give up every capability for good, after `isolate()` has used them. Run as root, the candidate's
    process keeps uid 0 (its build caches and the GPU work as before) but can no longer undo the
    read-only mounts (CAP_SYS_ADMIN: a remount made the whole file system writable again), read
    another process's memory (CAP_SYS_PTRACE), or regain any of it by exec (no_new_privs, an empty
    bounding set, SECBIT_NOROOT). None when done, else why not (recorded as a partial sandbox)."""
    libc = load_libc()
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        return "no_new_privs refused"
    try:
        last_cap = int(Path("/proc/sys/kernel/cap_last_cap").read_text())
    except (OSError, ValueError):
        last_cap = 63
    for cap in range(last_cap + 1):
        libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)  # needs CAP_SETPCAP; the status below says if it held
    libc.prctl(PR_SET_SECUREBITS, SECUREBITS_NO_ROOT, 0, 0, 0)
    if libc.capset(ctypes.byref(_CapHeader(CAPABILITY_VERSION_3, 0)), (_CapData * 2)()) != 0:
        return f"capset: {os.strerror(ctypes.get_errno())}"
    kept = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("CapEff", "CapPrm", "CapBnd", "CapAmb") and int(value.strip(), 16):
            kept[key] = value.strip()
    return f"capabilities kept ({', '.join(f'{k} {v}' for k, v in kept.items())})" if kept else None


def _root_writable() -> bool:
    probe = Path("/.cudagym_write_probe")
    try:
        probe.write_text("")
        probe.unlink()
        return True
    except OSError:
        return False


class MemoryWatchdog:
    """Kills a child whose resident memory passes a limit; `fired` says whether it did.
    tree: count the child and all its descendants (a shell's commands, a build's compilers)."""

    def __init__(self, pid: int, limit_bytes: int, period_s: float = 0.05, tree: bool = False):
        self.pid, self.limit_bytes, self.period_s, self.tree = pid, limit_bytes, period_s, tree
        self.fired = False
        self.peak_bytes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> "MemoryWatchdog":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _watch(self) -> None:
        while not self._stop.is_set():
            rss = tree_rss_bytes(self.pid) if self.tree else rss_bytes(self.pid)
            if rss is None:
                return
            self.peak_bytes = max(self.peak_bytes, rss)
            if rss > self.limit_bytes:
                self.fired = True
                kill_tree(self.pid)
                return
            self._stop.wait(self.period_s)  # wakes at once when the watched call ends


def rss_bytes(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return None
    return None


def tree_rss_bytes(pid: int) -> int | None:
    """Resident memory of `pid` and its descendants (one pass over /proc), None once `pid` is gone."""
    parents, rss = {}, {}
    page = os.sysconf("SC_PAGE_SIZE")
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        child = int(entry.name)
        parents[child], rss[child] = int(fields[1]), int(fields[21]) * page
    if pid not in rss:
        return None
    total, frontier = 0, [pid]
    children: dict[int, list[int]] = {}
    for child, parent in parents.items():
        children.setdefault(parent, []).append(child)
    while frontier:
        p = frontier.pop()
        total += rss.get(p, 0)
        frontier.extend(children.get(p, ()))
    return total


def kill_tree(pid: int) -> None:
    """SIGKILL the child's process group (it is started in its own session) and the child."""
    for kill in (lambda: os.killpg(pid, signal.SIGKILL), lambda: os.kill(pid, signal.SIGKILL)):
        try:
            kill()
        except (ProcessLookupError, PermissionError):
            pass


def describe_exit(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"killed by signal {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exited with code {returncode}"


# -- confined commands (an agent's shell) ------------------------------------------------------------
# `isolate()` above protects the judge from a candidate it imports. An agent's shell needs more: it
# must not read other rollouts' workdirs or the judge's temporary files either, and a root shell in
# a mount namespace could simply remount / read-write. So `run_confined` starts `confine.py` as a small
# launcher that, as root: enters new mount, network, pid, IPC and UTS namespaces; covers `hidden`
# paths with empty read-only tmpfs mounts and binds the workdir (and build dirs) back; makes every
# other mount read-only and the protected files read-only bind mounts; then forks the command as
# pid 1 of the new pid namespace, which mounts a fresh /proc (no other process visible), drops to an
# unprivileged uid with no_new_privs (no capability left to undo a mount, no setuid binary to regain
# one), sets RLIMIT_NPROC / RLIMIT_FSIZE / RLIMIT_CORE and execs. When that pid 1 ends, the kernel
# kills everything else in its namespace: background children never outlive the call, and a
# timeout or memory kill of the launcher's process group ends the whole tree.
# Anything that cannot be set up ends the launcher with CONFINE_FAILED before the command runs:
# it fails closed, never runs unconfined.

@dataclass(frozen=True)
class Confinement:
    """Where a confined command may write and what it cannot see."""

    workdir: str
    writable: tuple[str, ...] = ()  # more writable directories (a build cache beside the workdir)
    read_only: tuple[str, ...] = ()  # paths inside the workdir the command cannot change (protected files)
    hidden: tuple[str, ...] = ()  # directories covered by an empty read-only tmpfs (other rollouts, /tmp, $HOME)
    visible: tuple[str, ...] = ()  # directories under a hidden one shown again, read-only (a Python under $HOME)
    uid: int = 65534
    gid: int = 65534
    max_processes: int = 256  # RLIMIT_NPROC of `uid`: a fork bomb stops there
    max_file_bytes: int = 4 * 2**30  # RLIMIT_FSIZE: one file cannot fill the disk
    shm_bytes: int = 64 * 2**20  # a private /dev/shm (multiprocessing semaphores), gone with the namespace

    def __post_init__(self):
        if self.uid == 0 or self.gid == 0:
            raise ValueError("a confined command never runs as root (uid/gid 0)")
        if self.max_processes < 1:
            raise ValueError("max_processes must be at least 1")


@dataclass
class ConfinedResult:
    returncode: int | None  # the command's exit status (negative: killed by that signal)
    output: str  # the head and the tail of what it printed (stdout and stderr together), decoded
    output_bytes: int = 0  # everything it printed, kept or not
    truncated: bool = False  # output keeps only the first and last `keep_bytes` of output_bytes
    timed_out: bool = False
    killed_for_memory: bool = False
    peak_rss_bytes: int = 0
    elapsed_s: float = 0.0
    confine_error: str | None = None  # set when confinement failed: the command did not run
    events: list[str] = field(default_factory=list)  # what happened, in words, for the record


def run_confined(argv: list[str], confinement: Confinement, env: dict[str, str], timeout_s: float,
                 memory_limit_bytes: int, keep_bytes: int = 64_000, started=None) -> ConfinedResult:
    """Run `argv` confined; keep at most `keep_bytes` of the head and of the tail of its output while
    reading (a command printing 50 MB never makes this process hold 50 MB). Never raises for what the
    command does: a timeout, a memory kill, a crash or a confinement failure is in the result.
    started(pid): called with the launcher's pid (its process group), so a caller can kill it early."""
    import json
    import select
    import subprocess
    import sys

    from cudagym.tasks import confine

    spec = json.dumps(asdict(confinement))
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-I", "-S", confine.__file__, spec, "--", *argv],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                            start_new_session=True)
    if started:
        started(proc.pid)
    head, tail, total = bytearray(), bytearray(), 0
    timed_out = False
    fd = proc.stdout.fileno()
    with MemoryWatchdog(proc.pid, memory_limit_bytes, period_s=0.2, tree=True) as watchdog:
        deadline = t0 + timeout_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = True
                kill_tree(proc.pid)
                break
            ready, _, _ = select.select([fd], [], [], min(left, 0.5))
            if not ready:
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            total += len(chunk)
            if len(head) < keep_bytes:
                take = keep_bytes - len(head)
                head += chunk[:take]
                chunk = chunk[take:]
            if chunk:
                tail += chunk
                del tail[:-keep_bytes]
        kill_tree(proc.pid)  # the launcher's group, and with its pid 1 the whole namespace
        proc.wait()
    end_processes_of(confinement.uid)  # the namespace dies asynchronously: make sure nothing is left
    proc.stdout.close()
    output = (head + tail).decode(errors="replace")
    result = ConfinedResult(returncode=proc.returncode, output=output, output_bytes=total,
                            truncated=total > len(head) + len(tail), timed_out=timed_out,
                            killed_for_memory=watchdog.fired, peak_rss_bytes=watchdog.peak_bytes,
                            elapsed_s=time.monotonic() - t0)
    if proc.returncode == CONFINE_FAILED and output.startswith(CONFINE_PREFIX):
        result.confine_error = output[len(CONFINE_PREFIX):].strip().splitlines()[0]
        result.events.append(f"sandbox could not be set up ({result.confine_error}): the command did not run")
    if timed_out:
        result.events.append(f"timed out after {timeout_s:.0f} s: killed with its process group and namespace")
    if watchdog.fired:
        result.events.append(f"killed: memory passed {memory_limit_bytes >> 20} MiB")
    return result


def end_processes_of(uid: int, wait_s: float = 10.0) -> list[int]:
    """SIGKILL every live process of `uid` (a confined command's own uid) until none is left or
    wait_s passed; returns those still alive then (zombies do not count: they run nothing)."""
    deadline = time.monotonic() + wait_s
    while True:
        alive = []
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                with open(f"/proc/{entry.name}/stat", "rb") as f:
                    state = f.read().rsplit(b")", 1)[1].split()[0]
                if state != b"Z" and os.stat(f"/proc/{entry.name}").st_uid == uid:
                    alive.append(int(entry.name))
            except (OSError, IndexError):
                continue
        if not alive or time.monotonic() > deadline:
            return alive
        for pid in alive:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.05)
