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
from pathlib import Path

CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWNET = 0x00020000, 0x10000000, 0x40000000
MS_RDONLY, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 32, 4096, 16384, 1 << 18
# Pseudo file systems stay as they are: /dev holds the GPU device nodes, /dev/shm backs shared tensors.
KEEP_WRITABLE = ("/proc", "/sys", "/dev")


def _libc():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_void_p]
    return libc


def _check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _enter_namespaces(libc) -> None:
    if os.geteuid() == 0:
        _check(libc.unshare(CLONE_NEWNS | CLONE_NEWNET), "unshare")
        return
    # Unprivileged: a user namespace grants the mount/net capabilities inside it only.
    uid, gid = os.getuid(), os.getgid()
    _check(libc.unshare(CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWNET), "unshare(user)")
    Path("/proc/self/setgroups").write_text("deny")
    Path("/proc/self/uid_map").write_text(f"{uid} {uid} 1")
    Path("/proc/self/gid_map").write_text(f"{gid} {gid} 1")


def isolate(workdir: str | Path, writable: list[str | Path] = ()) -> str:
    """Cut the network and make the file system read-only except `workdir` and `writable`.

    Returns "full" on success or "partial: <why>"; the caller records it in the verdict's env so a
    run on a machine without namespaces is visible as such, instead of failing outright.
    """
    libc = _libc()
    keep = [str(Path(p).resolve()) for p in [workdir, *writable] if p]
    try:
        _enter_namespaces(libc)
        _check(libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "make / private")
        for path in keep:
            Path(path).mkdir(parents=True, exist_ok=True)
            _check(libc.mount(path.encode(), path.encode(), None, MS_BIND | MS_REC, None), f"bind {path}")
        mounts = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()]
        for mount in mounts:
            mount = mount.replace("\\040", " ")
            if mount in keep or mount.startswith(KEEP_WRITABLE):
                continue
            # Some mounts (already read-only, locked in a user namespace) refuse; that leaves them as they were.
            libc.mount(None, mount.encode(), None, MS_REMOUNT | MS_BIND | MS_RDONLY, None)
        if os.access("/", os.W_OK) and _root_writable():
            return "partial: root file system still writable"
        return "full"
    except OSError as e:
        return f"partial: {e.strerror or e}"


def _root_writable() -> bool:
    probe = Path("/.cudagym_write_probe")
    try:
        probe.write_text("")
        probe.unlink()
        return True
    except OSError:
        return False


class MemoryWatchdog:
    """Kills a child whose resident memory passes a limit; `fired` says whether it did."""

    def __init__(self, pid: int, limit_bytes: int, period_s: float = 0.05):
        self.pid, self.limit_bytes, self.period_s = pid, limit_bytes, period_s
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
            rss = rss_bytes(self.pid)
            if rss is None:
                return
            self.peak_bytes = max(self.peak_bytes, rss)
            if rss > self.limit_bytes:
                self.fired = True
                kill_tree(self.pid)
                return
            time.sleep(self.period_s)


def rss_bytes(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return None
    return None


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
