"""Sandbox: a child that calls isolate() loses the network and every writable path but its own;
the memory watchdog kills a child past its limit; signal exits are described by name."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from cudagym.tasks.sandbox import MemoryWatchdog, describe_exit

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Runs in a fresh interpreter: isolate first (single-threaded, nothing heavy imported), then probe.
CHILD = textwrap.dedent("""
    import errno, json, os, socket, sys
    from cudagym.tasks.sandbox import isolate

    args = json.loads(sys.argv[1])
    result = {"isolate": isolate(args["workdir"], args["writable"])}

    def write(path):
        try:
            with open(path, "w") as f:
                f.write("x")
            return "ok"
        except OSError as e:
            return errno.errorcode.get(e.errno, str(e.errno))

    for name, path in args["writes"].items():
        result[name] = write(path)
    try:
        socket.create_connection(("127.0.0.1", args["port"]), timeout=2).close()
        result["connect"] = "ok"
    except OSError as e:
        result["connect"] = errno.errorcode.get(e.errno, type(e).__name__)
    print(json.dumps(result))
""")


def run_isolated(workdir, writable, writes, port) -> dict:
    args = json.dumps({"workdir": str(workdir), "writable": [str(p) for p in writable],
                       "writes": {k: str(v) for k, v in writes.items()}, "port": port})
    env = dict(os.environ, PYTHONPATH=REPO, PYTHONDONTWRITEBYTECODE="1")
    proc = subprocess.run([sys.executable, "-c", CHILD, args], capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture
def listener():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    try:
        yield server.getsockname()[1]
    finally:
        server.close()


def test_isolate_confines_writes_and_network(tmp_path, listener):
    workdir, extra, outside = tmp_path / "work", tmp_path / "cache", tmp_path / "outside"
    for d in (workdir, extra, outside):
        d.mkdir()
    repo_probe = os.path.join(REPO, f".sandbox_probe_{os.getpid()}")
    # Sanity: from here (not isolated) the same targets are writable and the listener answers.
    socket.create_connection(("127.0.0.1", listener), timeout=2).close()

    result = run_isolated(workdir, [extra], {"in_workdir": workdir / "a.txt", "in_writable": extra / "b.txt",
                                             "outside": outside / "c.txt", "repo": repo_probe}, listener)
    try:
        if os.geteuid() == 0:
            assert result["isolate"] == "full"
        elif not result["isolate"].startswith("full"):
            pytest.skip(f"no namespaces here: {result['isolate']}")
        assert result["in_workdir"] == "ok" and (workdir / "a.txt").read_text() == "x"
        assert result["in_writable"] == "ok" and (extra / "b.txt").read_text() == "x"
        assert result["outside"] in ("EROFS", "EPERM", "EACCES")
        assert result["repo"] in ("EROFS", "EPERM", "EACCES")
        assert not (outside / "c.txt").exists()
        assert not os.path.exists(repo_probe)
        assert result["connect"] != "ok"
    finally:
        if os.path.exists(repo_probe):
            os.unlink(repo_probe)


def test_watchdog_kills_child_past_the_limit():
    # Written chunk by chunk, so the pages are resident (a zero-filled bytearray may not be).
    code = "import time\nchunks = [bytearray(b'\\x01') * (50 << 20) for _ in range(20)]\ntime.sleep(30)"
    proc = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    t0 = time.monotonic()
    try:
        with MemoryWatchdog(proc.pid, 200 * 2**20, period_s=0.02) as watchdog:
            rc = proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert watchdog.fired
    assert rc == -signal.SIGKILL
    assert watchdog.peak_bytes > 100 * 2**20
    assert time.monotonic() - t0 < 20  # killed, not left to finish its sleep


def test_watchdog_leaves_small_child_alone():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.5)"], start_new_session=True)
    with MemoryWatchdog(proc.pid, 1 << 30, period_s=0.02) as watchdog:
        rc = proc.wait(timeout=30)
    assert rc == 0 and not watchdog.fired


def test_describe_exit():
    assert "SIGSEGV" in describe_exit(-11)
    assert "SIGKILL" in describe_exit(-9)
    assert describe_exit(3) == "exited with code 3"
