"""Session-wide test environment: CPU-only, offline, shared compile caches, the KernelBench file.

The env defaults are set at import time, before any test module imports torch, prefect or
huggingface_hub (all read them once at import). `make test` sets the same values; running pytest
directly gets them from here.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SHARED_KERNELBENCH = REPO.parent / "shared" / "kernelbench" / "problems.jsonl"

os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(REPO / ".cache" / "inductor"))
os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(REPO / ".cache" / "torch_extensions"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("CUDAGYM_LOCK_DIR", str(REPO / ".cache" / "locks"))  # the suite's device locks, not the machine's
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "90")
if not os.environ.get("CUDAGYM_KERNELBENCH") and SHARED_KERNELBENCH.is_file():
    os.environ["CUDAGYM_KERNELBENCH"] = str(SHARED_KERNELBENCH)
# C++ candidates build against a precompiled torch/extension.h where `make test` has built one
# (cudagym.eval.header_cache): about 3x faster a build, and the suite builds dozens.
HEADER_CACHE = REPO / ".cache" / "headers"
if HEADER_CACHE.is_dir():
    from cudagym.eval.header_cache import ready

    if (_headers := ready(HEADER_CACHE)) is not None:
        os.environ["CPATH"] = os.pathsep.join(filter(None, [str(_headers), os.environ.get("CPATH")]))
# Tests stop batches with a real SIGINT. A shell that starts the suite in the background (`make test &`
# in a script) starts Python with SIGINT ignored, and those tests would then wait out their hanging
# tasks instead of stopping: handle it as an interactive run does.
signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(scope="session")
def kernelbench_path() -> Path:
    """The KernelBench problems file (JSONL): $CUDAGYM_KERNELBENCH, else the workplace copy."""
    env = os.environ.get("CUDAGYM_KERNELBENCH", "").strip()
    for candidate in ([Path(env)] if env else []) + [SHARED_KERNELBENCH]:
        if candidate.is_file():
            return candidate
    pytest.skip(f"no KernelBench file: set CUDAGYM_KERNELBENCH or provide {SHARED_KERNELBENCH}")


@pytest.fixture(scope="session")
def prefect_harness():
    """One temporary Prefect server (SQLite) for the whole session: it takes 15-20 s to start."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield
