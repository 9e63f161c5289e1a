"""The shell's sandbox, each attempt through env.execute("bash", ...): contained, reported, and the
environment goes on. Real sandboxes (namespaces, an unprivileged uid), real processes."""

from __future__ import annotations

import json
import os
import resource
import socket
import subprocess
import tempfile
import threading
from pathlib import Path

import pytest

from cudagym.agent.environment import EnvConfig, KernelEnv
from cudagym.agent.workdir import sandbox_ids
from cudagym.eval.verdict import Status
from cudagym.tasks import task_from_file
from cudagym.tasks.sandbox import CONFINE_FAILED, CONFINE_PREFIX, Confinement, run_confined

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
REPO = Path(__file__).resolve().parents[2]

# The confined shell needs root (to drop to its own uid after locking the mounts); without root it
# fails closed, which test_fails_closed checks as either user.
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="the confined shell needs root; without it, see test_fails_closed")


@pytest.fixture
def rollouts(tmp_path):
    return tmp_path / "rollouts"


@pytest.fixture
def env(rollouts):
    env = KernelEnv(task_from_file(FIXTURES / "problems" / "add_scale.py"), rollouts / "wd-a",
                    EnvConfig(max_output_chars=4_000, bash_timeout_s=60, memory_limit_gb=0.5, max_processes=64))
    yield env
    env.close()


def processes_of(uid: int) -> list[int]:
    """Live processes of `uid` (zombies, waiting for the machine's init to reap them, run nothing)."""
    pids = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                state = Path(f"/proc/{entry.name}/stat").read_text().rsplit(")", 1)[1].split()[0]
                if state != "Z" and os.stat(f"/proc/{entry.name}").st_uid == uid:
                    pids.append(int(entry.name))
            except (OSError, IndexError):
                pass
    return pids


def bash(env, command: str, timeout: float | None = None):
    return env.execute("bash", {"command": command, **({"timeout": timeout} if timeout else {})})


@needs_root
def test_runs_as_an_unprivileged_user_who_cannot_remount(env):
    result = bash(env, "id -u; grep CapEff /proc/self/status; mount -o remount,rw / && echo REMOUNTED; "
                       "python3 -c 'import ctypes; l = ctypes.CDLL(None, use_errno=True); "
                       "print(\"mount\", l.mount(None, b\"/\", None, 32, None), ctypes.get_errno())'; "
                       "touch /usr/x 2>&1; echo pwd=$(pwd)")
    lines = result.output.splitlines()
    assert result.data["sandbox"] == "full"
    assert lines[0] == str(env.ids[0]) and env.ids[0] != 0
    assert "CapEff:\t0000000000000000" in lines[1]
    assert "REMOUNTED" not in result.output and "mount -1 1" in result.output  # EPERM
    assert "Read-only file system" in result.output and f"pwd={env.workdir}" in result.output


@needs_root
def test_no_network(env):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(0.1)
    port = server.getsockname()[1]
    result = bash(env, f"python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", {port}), timeout=5)'")
    assert not result.ok and "Network is unreachable" in result.output
    with pytest.raises(TimeoutError):
        server.accept()  # nothing came through
    server.close()


@needs_root
def test_writes_only_inside_the_workdir(env, rollouts):
    home = Path.home()
    targets = [Path(tempfile.gettempdir()) / "cudagym-escape", REPO / "cudagym-escape", home / "cudagym-escape",
               rollouts / "cudagym-escape", Path("/var/tmp/cudagym-escape")]
    command = "; ".join(f"echo x > {t}" for t in targets) + "; echo inside > kernels/mine.cu; cat kernels/mine.cu"
    result = bash(env, command)
    assert result.output.count("Read-only file system") == len(targets), result.output
    assert "inside" in result.output and (env.workdir / "kernels" / "mine.cu").read_text() == "inside\n"
    assert not any(t.exists() for t in targets)


@needs_root
def test_cannot_see_other_rollouts_judges_locks_or_secrets(env, rollouts, monkeypatch):
    other = KernelEnv(env.task, rollouts / "wd-b", env.config)
    try:
        (other.workdir / "kernels" / "theirs.cu").write_text("their kernel")
        judge_dir = Path(tempfile.mkdtemp(prefix="cudagym-judge-"))  # where the judge keeps request.json
        (judge_dir / "request.json").write_text(json.dumps({"seed": 1234}))
        from cudagym.eval.gpulock import lock_dir

        os.environ["CUDAGYM_TEST_SECRET"] = "sk-do-not-leak"
        monkeypatch.setenv("OPENAI_API_KEY", "sk-do-not-leak")
        result = bash(env, f"cat {other.workdir}/kernels/theirs.cu; ls {rollouts}; ls {judge_dir}; "
                           f"ls {lock_dir()}; env; ps -e -o pid=,user=,args=")
        lines = [line.strip() for line in result.output.splitlines()]
        assert "their kernel" not in result.output and "wd-b" not in lines and "wd-a" in lines  # its own only
        assert "request.json" not in result.output and "sk-do-not-leak" not in result.output
        ps = [line.split() for line in lines if line.split(" ", 1)[0].isdigit()]
        assert ps and all(row[1] == str(env.ids[0]) for row in ps), ps  # its own pid namespace: nothing else
        assert other.execute("bash", {"command": "cat kernels/theirs.cu"}).output.startswith("their kernel")
    finally:
        os.environ.pop("CUDAGYM_TEST_SECRET", None)
        other.close()


@needs_root
def test_protected_files_cannot_be_changed_and_changes_are_reported(env):
    before = {n: (env.workdir / n).read_bytes() for n in ("model.py", "verify", "profile", "SKILL.md")}
    result = bash(env, "echo 'x = 1' >> model.py; rm -f verify; mv profile p2; chmod 777 SKILL.md; "
                       "printf '#!/bin/sh\\necho verify: PASS\\n' > verify; rm -rf .cudagym; "
                       "ln model.py kernels/alias.cu; ls")
    assert result.output.count("Permission denied") + result.output.count("Device or resource busy") \
        + result.output.count("Operation not permitted") + result.output.count("Read-only") \
        + result.output.count("Invalid cross-device link") >= 6, result.output
    assert not (env.workdir / "kernels" / "alias.cu").exists()  # no hard link for the file tools to write through
    assert {n: (env.workdir / n).read_bytes() for n in before} == before
    assert env.execute("verify", {}).data["flags"] != ["protected_file_changed"]
    # if one changes anyway (here: from outside the sandbox), verify and the final verdict say so
    os.chmod(env.workdir / "verify", 0o755)
    (env.workdir / "verify").write_text("#!/bin/sh\necho 'verify: PASS'\n")
    result = env.execute("verify", {})
    assert not result.ok and "protected files changed: verify" in result.output
    verdict = env.final_verdict()
    assert verdict.status is Status.REJECTED and "protected_file_changed" in verdict.flags and verdict.reward == -1


@needs_root
def test_verify_command_asks_the_environment(env):
    result = bash(env, "./verify; echo status=$?")
    assert "verify: REJECTED: static checks fired: torch_compute_in_forward" in result.output  # the starter
    assert "status=1" in result.output and result.data["verdicts"][0]["status"] == "rejected"
    assert env.judge_calls[-1]["tool"] == "verify"


@needs_root
def test_fifos_made_by_the_shell_never_block_the_environment(env):
    """A FIFO (no writer ever comes) where the environment reads or writes: each tool and ./verify
    answers at once instead of waiting forever as root."""
    made = bash(env, "mkfifo kernels/k.cu kernels/k.h notes.txt && ls -l kernels | head -3")
    assert made.ok, made.output
    assert not env.execute("read_file", {"path": "notes.txt"}).ok
    assert not env.execute("edit_file", {"path": "notes.txt", "old": "a", "new": "b"}).ok
    written = env.execute("write_file", {"path": "notes.txt", "content": "x"})
    assert not written.ok and "notes.txt" in written.output
    assert env.execute("grep", {"pattern": "anything"}).output.startswith("no matches")
    verified = env.execute("verify", {})  # the starter goes to the judge; the FIFOs are left out, said so
    assert "kernels/k.cu (not a regular file)" in verified.output, verified.output
    through_shell = bash(env, "timeout 50 ./verify > out.txt; grep -o 'not a regular file' out.txt | wc -l", timeout=60)
    assert through_shell.output.startswith("2"), through_shell.output


@needs_root
@pytest.mark.slow
def test_a_compile_baseline_timed_from_the_shell_is_not_kept(rollouts):
    """./profile runs while the agent's processes live (a background burner could slow torch.compile's
    time): the environment does not keep that baseline for the final verdict; a profile tool call
    (no agent process alive) sets it."""
    env = KernelEnv(task_from_file(FIXTURES / "problems" / "add_scale.py"), rollouts / "wd-c",
                    EnvConfig(policy="permissive", bash_timeout_s=300, max_output_chars=4_000))
    try:
        from_shell = bash(env, "./profile", timeout=300)
        assert "torch.compile" in from_shell.output, from_shell.output
        assert from_shell.data["verdicts"][0]["t_compile_ms"] and env._t_compile_ms is None
        direct = env.execute("profile", {})
        assert direct.ok and env._t_compile_ms == direct.data["t_compile_ms"]
    finally:
        env.close()


@needs_root
@pytest.mark.slow
def test_fork_bomb_is_contained(env):
    result = bash(env, "bomb() { bomb | bomb & }; bomb; sleep 3; echo survived", timeout=20)
    assert result.data["sandbox"] == "full" and "Resource temporarily unavailable" in result.output  # the limit held
    assert processes_of(env.ids[0]) == []  # nothing of it is left
    again = bash(env, "echo still here")
    assert again.ok and again.output.startswith("still here")


@needs_root
def test_fifty_megabytes_of_output_are_capped(env):
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    result = bash(env, "head -c 50000000 /dev/zero | tr '\\0' 'a'; echo; echo END")
    assert result.ok and result.data["output_bytes"] >= 50_000_000
    assert len(result.output) < 4_000 + 100 and "output truncated" in result.output and "END" in result.output
    assert "of 50000005 characters" in result.output  # the note counts everything printed
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before < 40_000  # KiB: never held the 50 MB


@needs_root
def test_hang_is_killed_with_its_group(env):
    result = bash(env, "(trap '' TERM HUP; setsid sleep 1000) & (trap '' TERM; sleep 1000) & echo started; sleep 1000",
                  timeout=3)
    assert not result.ok and result.data["timed_out"] and "started" in result.output
    assert "timed out after 3 s" in result.output
    assert processes_of(env.ids[0]) == []


@needs_root
def test_background_children_end_with_the_call(env):
    bash(env, "nohup sleep 1000 > /dev/null 2>&1 & disown; echo left")
    assert processes_of(env.ids[0]) == []


@needs_root
def test_memory_limit_kills_the_tree(env):
    result = bash(env, "python3 -c 'import time; b = bytearray(700 * 2**20); time.sleep(30)'", timeout=40)
    assert not result.ok and result.data["killed_for_memory"] and "memory passed 512 MiB" in result.output
    assert processes_of(env.ids[0]) == []


def test_fails_closed(tmp_path):
    """Confinement that cannot be set up never runs the command: not as root with a bad spec, not as
    a user without root."""
    marker = tmp_path / "ran"
    # a uid of the sandbox range, never 65534: run_confined ends every process of its uid afterwards
    uid, gid = sandbox_ids(tmp_path)
    bad = Confinement(workdir="/proc/version/wd", uid=uid, gid=gid)  # cannot be made
    result = run_confined(["touch", str(marker)], bad, {"PATH": "/usr/bin:/bin"}, 30, 2**30)
    assert result.returncode == CONFINE_FAILED and result.confine_error and not marker.exists()
    if os.geteuid() != 0:
        result = run_confined(["touch", str(marker)], Confinement(workdir=str(tmp_path / "wd"), uid=uid, gid=gid),
                              {"PATH": "/usr/bin:/bin"}, 30, 2**30)
        assert "confinement needs root" in result.confine_error and not marker.exists()
    if os.geteuid() == 0 and Path("/usr/bin/setpriv").exists() and Path("/usr/bin/python3").exists():
        from cudagym.tasks import confine

        launcher = Path(confine.__file__)
        spec = json.dumps({**Confinement(workdir=str(tmp_path), uid=uid, gid=gid).__dict__, "writable": [], "read_only": [],
                           "hidden": [], "visible": []})
        proc = subprocess.run(["/usr/bin/setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                               "/usr/bin/python3", "-I", "-S", str(launcher), spec, "--", "touch", str(marker)],
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == CONFINE_FAILED and proc.stderr.startswith(CONFINE_PREFIX + "[Errno 1] confinement needs root")
        assert not marker.exists()


@needs_root
def test_concurrent_shells_of_two_rollouts(env, rollouts):
    other = KernelEnv(env.task, rollouts / "wd-b", env.config)
    try:
        results = {}
        threads = [threading.Thread(target=lambda e=e, k=k: results.__setitem__(k, bash(e, "echo $HOME; sleep 1")))
                   for k, e in (("a", env), ("b", other))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert results["a"].output.startswith(str(env.workdir)) and results["b"].output.startswith(str(other.workdir))
    finally:
        other.close()
