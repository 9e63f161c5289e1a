"""KernelEnv: one rollout's environment, the workdir, its tools, its sandbox and its judge.

The loop (cudagym.agent.loop) sees only `tool_schemas`, `system_prompt`, `task_prompt`, `execute`,
`final_verdict` and `close`. `execute` never raises: unknown tools, arguments that are not JSON or
not what the schema says come back as `ToolResult(ok=False, output="error: ...")`.

verify and profile (the tools, and the workdir's `./verify` / `./profile`, which reach this process
over a unix socket in the workdir's protected `.cudagym/`) check the protected files' hashes, then
send model_new.py and kernels/ to the judge (`cudagym.eval.evaluate.evaluate_candidate`, a process
of its own, outside the agent's sandbox). `final_verdict` does the same with the full check and
timing; its `reward` is the contract's milestone reward.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path

from cudagym.agent.tools import TOOLS, ToolResult, call_tool, error, truncate
from cudagym.agent.workdir import (BUILD_DIR, CONTROL_DIR, SOCKET_NAME, TMP_DIR, WorkdirError, candidate_sources,
                                   changed_protected, create_workdir, release_ids, sandbox_ids)
from cudagym.eval.evaluate import EvalConfig, evaluate_candidate
from cudagym.eval.verdict import Status, Verdict
from cudagym.tasks import Task
from cudagym.tasks.sandbox import Confinement, end_processes_of, kill_tree, run_confined

__all__ = ["TOOL_NAMES", "EnvConfig", "KernelEnv", "ToolResult"]

TOOL_NAMES = ("bash", "read_file", "write_file", "edit_file", "glob", "grep", "verify", "profile")
PROTECTED_FLAG = "protected_file_changed"
# Variables a shell inherits from the environment's process (toolchains, GPUs); nothing else (no keys).
PASSED_ENV = ("CUDA_HOME", "CUDA_PATH", "LD_LIBRARY_PATH", "TORCH_CUDA_ARCH_LIST", "MAX_JOBS", "CC", "CXX", "CPATH",
              "NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES")
SYSTEM_PATH = ("/usr/local/cuda/bin", "/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")

SYSTEM_PROMPT = """You are an expert GPU kernel engineer working in a sandboxed workdir with tools.
Your task: replace a PyTorch reference (model.py) with ModelNew in model_new.py, built from your own \
{kind} kernels in kernels/, that is correct and faster than the reference (ideally more than 5% faster than \
torch.compile of it).
Read SKILL.md in the workdir first: it has the workflow, the op policy (what ModelNew may and may not \
use), how model_new.py loads kernels/, the tools, and how you are scored.
Work with the tools: write files, compile and test in bash, `verify` until correct, `profile` to measure, \
iterate. model.py, SKILL.md, verify and profile cannot be changed. The judge runs outside your sandbox \
on your files; its inputs are secret. When you are done, answer without calling a tool: the judge then \
scores model_new.py and kernels/ as they are (reward -1 incorrect, 1 correct, 2 faster than eager, \
3 faster than eager and torch.compile)."""

TASK_PROMPT = """Write ModelNew for this task (model.py in your workdir, {device}):

```python
{code}
```

Success: `verify` passes (outputs within atol = rtol = 1e-2 on secret inputs, op policy {policy}) and \
`profile` shows ModelNew more than 5% faster than torch.compile. model_new.py starts as the reference \
renamed (correct, but rejected by the op policy). Start by reading SKILL.md."""


@dataclass(frozen=True)
class EnvConfig:
    device: str = "cpu"  # "cpu" | "cuda" | "cuda:N": where verify/profile/final judge run
    policy: str = "strict"  # op policy passed to the judge (EvalConfig.policy)
    timing_mode: str = "strict"  # "strict" | "paper" (EvalConfig.timing_mode)
    precision: str = "strict"
    max_output_chars: int = 16_000  # tool outputs longer than this are truncated with a note saying so
    bash_timeout_s: float = 180.0  # default and upper bound for one bash call
    memory_limit_gb: float = 8.0  # per bash command / build: resident memory of its whole process tree
    max_processes: int = 256  # per bash command (fork bombs): RLIMIT_NPROC of the workdir's own uid
    judge_timeout_s: float | None = None  # bound on one verify/profile/final judge call
    compile_baseline: bool = True  # time torch.compile live (once per env; later calls reuse it); off: no compile times
    t_compile_ms: float | None = None  # a cached torch.compile time for this task (eval's baselines): never timed live
    n_checks: int = 5  # input sets the judge checks (EvalConfig.n_checks)
    hide_paths: tuple[str, ...] = ()  # more folders the shell must not see (e.g. the rollout's OUT folder)

    def __post_init__(self):
        if self.max_output_chars < 200:
            raise ValueError("max_output_chars must be at least 200")
        if self.bash_timeout_s <= 0 or self.memory_limit_gb <= 0 or self.max_processes < 1:
            raise ValueError("bash_timeout_s and memory_limit_gb must be > 0, max_processes >= 1")
        if self.judge_timeout_s is not None and self.judge_timeout_s <= 0:
            raise ValueError("judge_timeout_s must be > 0")
        self.eval_config(timed=True)  # device, policy, timing mode and precision checked by the judge's config

    def eval_config(self, timed: bool) -> EvalConfig:
        return EvalConfig(device=self.device, policy=self.policy, timing_mode=self.timing_mode, precision=self.precision,
                          n_checks=self.n_checks, time_candidate=timed, compile_baseline=self.compile_baseline,
                          task_timeout_s=self.judge_timeout_s)


class KernelEnv:
    def __init__(self, task: Task, workdir: str | Path, config: EnvConfig = EnvConfig()):
        self.task, self.config = task, config
        self.workdir = Path(workdir).absolute()
        self.ids = sandbox_ids(self.workdir)
        self.hashes = create_workdir(task, self.workdir, *self.ids)
        self.judge_calls: list[dict] = []  # every verify/profile verdict (tools and ./verify alike), in order
        self._t_compile_ms = config.t_compile_ms
        self._judge_lock = threading.Lock()
        self._shells: set[int] = set()  # launcher pids of running bash calls
        self._closed = threading.Event()
        self._server = self._start_command_server()

    # -- what the loop asks -----------------------------------------------------------------------
    def tool_schemas(self) -> list[dict]:
        return [TOOLS[name].schema() for name in TOOL_NAMES]

    def system_prompt(self) -> str:
        return SYSTEM_PROMPT.format(kind="C++" if self.config.device == "cpu" else "CUDA")

    def task_prompt(self) -> str:
        device = "judged on the CPU" if self.config.device == "cpu" else f"judged on the GPU ({self.config.device})"
        return TASK_PROMPT.format(code=self.task.code.strip(), device=device, policy=self.config.policy)

    def execute(self, name: str, arguments: dict | str) -> ToolResult:
        t0 = time.perf_counter()
        try:
            args = parse_arguments(arguments)
            result = error(args) if isinstance(args, str) else call_tool(self, name, args)
        except Exception as e:  # a tool's own bug must not end the rollout: the model is told
            result = error(f"{name} failed: {type(e).__name__}: {e}")
        result.output = truncate(result.output, self.config.max_output_chars)
        result.elapsed_s = time.perf_counter() - t0
        return result

    def final_verdict(self) -> Verdict:
        """The judge's full check and timing of the workdir's current model_new.py and kernels/."""
        with self._judge_lock:
            rejected = self._protected_verdict()
            if rejected:
                return rejected
            try:
                return self._judge(timed=True)[0]
            except WorkdirError as e:  # no model_new.py, or too much to send: nothing to score
                return Verdict(status=Status.COMPILE_ERROR, reason=str(e), timing_mode=self.config.timing_mode,
                               precision=self.config.precision, **task_meta(self.task)).finish()

    def close(self) -> None:
        """Kill anything still running from the workdir and stop the command socket."""
        if self._closed.is_set():
            return
        self._closed.set()
        for pid in list(self._shells):
            kill_tree(pid)
        end_processes_of(self.ids[0])
        release_ids(self.ids[0])
        try:
            self._server.close()
        except OSError:
            pass
        try:
            (self.workdir / CONTROL_DIR / SOCKET_NAME).unlink()
        except OSError:
            pass

    # -- the judge ----------------------------------------------------------------------------------
    def judge(self, timed: bool) -> ToolResult:
        """verify (timed False) or profile (True), as a tool result for the model."""
        what = "profile" if timed else "verify"
        with self._judge_lock:
            rejected = self._protected_verdict()
            if rejected:
                self.judge_calls.append({"tool": what, **rejected.to_dict()})
                return ToolResult(output=f"{what}: REJECTED: {rejected.reason}", ok=False, data=rejected.to_dict())
            try:
                verdict, left_out, build_s = self._judge(timed)
            except WorkdirError as e:
                return error(str(e))
        self.judge_calls.append({"tool": what, **verdict.to_dict()})
        return ToolResult(output=describe_verdict(what, verdict, left_out), ok=verdict.correct,
                          data=verdict.to_dict(), build_s=build_s)

    def _protected_verdict(self) -> Verdict | None:
        changed = changed_protected(self.workdir, self.hashes)
        if not changed:
            return None
        verdict = Verdict(status=Status.REJECTED, flags=[PROTECTED_FLAG], timing_mode=self.config.timing_mode,
                          precision=self.config.precision, **task_meta(self.task),
                          reason=f"protected files changed: {', '.join(changed)} (they must stay as the environment made them)")
        return verdict.finish()

    def _judge(self, timed: bool) -> tuple[Verdict, list[str], float]:
        """(verdict, kernels/ files not sent, seconds spent building) for the workdir's candidate."""
        code, files, left_out = candidate_sources(self.workdir)
        config = self.config.eval_config(timed)
        if timed and self._t_compile_ms is not None:
            config = replace(config, compile_baseline=False)
        verdict = evaluate_candidate(self.task.code, code, config, task=self.task,
                                     t_compile_ms=self._t_compile_ms if timed else None, files=files)
        if timed and verdict.t_compile_ms and self._t_compile_ms is None and not self._shells:
            # compile the reference once per rollout, but only in a call made while none of the agent's
            # processes live: from its shell (./profile) a background burner could slow the baseline
            # that the final verdict would then be measured against
            self._t_compile_ms = verdict.t_compile_ms
        build_s = float(verdict.timing.get("info", {}).get("phase_s", {}).get("load", 0.0))
        return verdict, left_out, build_s

    # -- the shell ----------------------------------------------------------------------------------
    def confinement(self) -> Confinement:
        return Confinement(workdir=str(self.workdir), read_only=tuple(str(self.workdir / n) for n in
                                                                          ("model.py", "SKILL.md", "verify", "profile", CONTROL_DIR)),
                           hidden=tuple(hidden_paths(self.workdir, self.config.hide_paths)),
                           visible=tuple(dict.fromkeys([sys.prefix, sys.base_prefix])),
                           uid=self.ids[0], gid=self.ids[1], max_processes=self.config.max_processes)

    def shell_environment(self) -> dict[str, str]:
        env = {k: os.environ[k] for k in PASSED_ENV if k in os.environ}
        env.update(PATH=os.pathsep.join([str(Path(sys.executable).parent), *SYSTEM_PATH]), HOME=str(self.workdir),
                   TMPDIR=str(self.workdir / TMP_DIR), TORCH_EXTENSIONS_DIR=str(self.workdir / BUILD_DIR),
                   LANG="C.UTF-8", CUDAGYM_DEVICE=self.config.device)
        if self.config.device == "cpu":
            env["CUDA_VISIBLE_DEVICES"] = ""
        else:
            index = int(self.config.device.split(":")[1]) if ":" in self.config.device else 0
            visible = os.environ.get("CUDA_VISIBLE_DEVICES")
            env["CUDA_VISIBLE_DEVICES"] = visible.split(",")[index] if visible else str(index)
        return env

    def run_shell(self, command: str, timeout_s: float | None) -> ToolResult:
        limit = self.config.bash_timeout_s
        timeout_s = limit if timeout_s is None else timeout_s
        if not 0 < timeout_s <= limit:
            return error(f"timeout must be in (0, {limit:g}] seconds")
        if self._closed.is_set():
            return error("the environment is closed")
        calls_before = len(self.judge_calls)
        result = run_confined(["bash", "-c", command], self.confinement(), self.shell_environment(), timeout_s,
                              int(self.config.memory_limit_gb * 2**30), keep_bytes=self.config.max_output_chars,
                              started=self._shells.add)
        self._shells.clear()  # one shell at a time per rollout
        data = {"exit_code": result.returncode, "timed_out": result.timed_out,
                "killed_for_memory": result.killed_for_memory, "output_bytes": result.output_bytes,
                "peak_rss_bytes": result.peak_rss_bytes, "events": result.events,
                "verdicts": self.judge_calls[calls_before:]}
        if result.confine_error:
            data["sandbox"] = f"failed: {result.confine_error}"
            return ToolResult(output=f"error: the sandbox could not be set up ({result.confine_error}); "
                                     "the command was not run", ok=False, data=data)
        data["sandbox"] = "full"
        footer = [f"[exit code {result.returncode}]"] if not (result.timed_out or result.killed_for_memory) else []
        footer = "\n".join(footer + [f"[{event}]" for event in result.events])
        output = truncate(result.output, self.config.max_output_chars - len(footer) - 1, total=result.output_bytes)
        text = (output + ("\n" if output and not output.endswith("\n") else "")) + footer
        ok = result.returncode == 0 and not (result.timed_out or result.killed_for_memory)
        return ToolResult(output=text, ok=ok, data=data)

    # -- ./verify and ./profile ---------------------------------------------------------------------
    def _start_command_server(self) -> socket.socket:
        """A unix socket in the protected .cudagym/ that the workdir's commands ask (they hold no judge)."""
        control = self.workdir / CONTROL_DIR
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        handle = os.open(control, os.O_PATH | os.O_DIRECTORY)
        try:  # through the folder's handle: a deep workdir path would pass the 108-byte socket path limit
            server.bind(f"/proc/self/fd/{handle}/{SOCKET_NAME}")
        finally:
            os.close(handle)
        (control / SOCKET_NAME).chmod(0o666)  # the shell's uid connects; the folder stays root's, read-only
        server.listen(4)
        server.settimeout(0.5)
        threading.Thread(target=self._serve_commands, args=(server,), daemon=True).start()
        return server

    def _serve_commands(self, server: socket.socket) -> None:
        while not self._closed.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with conn:
                try:
                    conn.settimeout(10)
                    request = json.loads(conn.makefile("rb").readline(1024) or b"{}")
                    name = request.get("tool") if isinstance(request, dict) else None
                    result = self.execute(name, {}) if name in ("verify", "profile") else error("verify or profile expected")
                    conn.sendall(json.dumps({"ok": result.ok, "output": result.output}).encode())
                except (OSError, ValueError):
                    pass


def parse_arguments(arguments) -> dict | str:
    """The arguments as a dict, or one line saying why they are not one (the model's raw JSON allowed)."""
    if arguments is None or (isinstance(arguments, str) and not arguments.strip()):
        return {}
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError as e:
            return f"arguments are not valid JSON ({e.msg} at position {e.pos})"
    if not isinstance(arguments, dict):
        return f"arguments must be a JSON object, got {type(arguments).__name__}"
    return arguments


def task_meta(task: Task) -> dict:
    return {"level": task.level, "problem_id": task.problem_id, "name": task.name, "kb_version": task.kb_version}


def hidden_paths(workdir: Path, extra: tuple[str, ...] = ()) -> list[str]:
    """What a rollout's shell must not see: the folders holding other rollouts' workdirs (the parent,
    and the grandparent unless it is the root), temporary folders (judges work there), homes
    (credentials), the judges' device locks and shared build caches, and `extra`."""
    from cudagym.eval.gpulock import lock_dir

    paths = [workdir.parent, tempfile.gettempdir(), "/tmp", "/var/tmp", Path.home(), "/root", "/home", lock_dir()]
    if workdir.parent.parent != Path("/"):
        paths.append(workdir.parent.parent)
    paths += [os.environ[v] for v in ("TORCH_EXTENSIONS_DIR", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR",
                                      "CUDAGYM_CACHE") if os.environ.get(v)]
    return [str(p) for p in dict.fromkeys([*map(str, paths), *extra])]


def describe_verdict(what: str, verdict: Verdict, left_out: list[str]) -> str:
    """The verdict in a few lines for the model."""
    lines = [f"{what}: {verdict.status.value.upper()}" + (f": {verdict.reason}" if verdict.reason else "")]
    if verdict.flags:
        details = verdict.timing.get("flag_details", {})
        lines += [f"  flag {flag}" + (f": {'; '.join(map(str, details[flag]))[:400]}" if details.get(flag) else "")
                  for flag in verdict.flags]
    if verdict.correct and what == "verify":
        lines.append("  correct on every secret input set; the op policy was respected")
    if verdict.correct and verdict.t_candidate_ms:
        def speed(name: str, ms: float | None, ratio: float | None) -> str:
            return f"{name} {ms:.4f} ms ({ratio:.2f}x)" if ms and ratio else f"{name} not timed"
        lines.append(f"  ModelNew {verdict.t_candidate_ms:.4f} ms | {speed('eager', verdict.t_eager_ms, verdict.speedup_vs_eager)}"
                     f" | {speed('torch.compile', verdict.t_compile_ms, verdict.speedup_vs_compile)}"
                     f" | timing mode {verdict.timing_mode}")
        lines.append(f"  reward if you stopped now: {verdict.reward} (3: >5% faster than eager and torch.compile)")
    if left_out:
        lines.append("  not sent to the judge: " + ", ".join(left_out))
    return "\n".join(lines)
