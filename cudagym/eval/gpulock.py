"""One GPU, many judges: a readers-writer lock across processes (fcntl, writer preference).

Correctness checks may share the GPU (`shared`); timing may not (`exclusive`). A turnstile lock
makes a waiting timer block new readers, so timing is never starved by a stream of checks.
"""

from __future__ import annotations

import contextlib
import fcntl
import os


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
