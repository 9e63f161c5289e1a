"""One GPU, many judges: a readers-writer lock across processes (fcntl, writer preference), and a
shared memory budget so that judges waiting for the GPU cannot starve each other of its memory.

Correctness checks may share the GPU (`shared`); timing may not (`exclusive`). A turnstile lock
makes a waiting timer block new readers, so timing is never starved by a stream of checks.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time


@contextlib.contextmanager
def gpu_lock(path: str | None, exclusive: bool):
    if not path:
        yield
        return
    turnstile_fd, data_fd = _open(path + ".turnstile"), _open(path)
    try:
        fcntl.flock(turnstile_fd, fcntl.LOCK_EX)
        if exclusive:
            fcntl.flock(data_fd, fcntl.LOCK_EX)
            fcntl.flock(turnstile_fd, fcntl.LOCK_UN)
        else:
            fcntl.flock(turnstile_fd, fcntl.LOCK_UN)
            fcntl.flock(data_fd, fcntl.LOCK_SH)
        yield
    finally:
        fcntl.flock(data_fd, fcntl.LOCK_UN)
        os.close(data_fd)
        os.close(turnstile_fd)


def _open(path: str) -> int:
    """Open for locking; the driver creates the files before a sandboxed judge (read-only FS) needs them."""
    try:
        return os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return os.open(path, os.O_RDONLY | os.O_CREAT, 0o644)


@contextlib.contextmanager
def memory_reservation(path: str | None, n_bytes: int, budget_bytes: int, poll_s: float = 0.2):
    """Reserve n_bytes of a GPU memory budget shared by concurrent judges (a JSON ledger of
    pid -> bytes under flock), waiting until it fits. A judge alone is always admitted, however
    large: the budget bounds concurrency, it does not refuse work. Entries of dead processes are
    dropped, so a killed judge frees its share."""
    if not path:
        yield
        return
    ledger = path + ".memory"
    pid = os.getpid()
    while True:
        with _locked_ledger(ledger) as entries:
            used = sum(entries.values())
            if not entries or used + n_bytes <= budget_bytes:
                entries[str(pid)] = n_bytes
                break
        time.sleep(poll_s)
    try:
        yield
    finally:
        with _locked_ledger(ledger) as entries:
            entries.pop(str(pid), None)


@contextlib.contextmanager
def _locked_ledger(path: str):
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        raw = os.read(fd, 1 << 20)
        try:
            entries = {k: int(v) for k, v in json.loads(raw or b"{}").items() if alive(int(k))}
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
