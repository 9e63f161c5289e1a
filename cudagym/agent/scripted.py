"""Scripted policies behind a real OpenAI-compatible HTTP server, in this process.

`ScriptedServer` is a ThreadingHTTPServer on 127.0.0.1 answering POST /v1/chat/completions as an
OpenAI-compatible server does (`choices[0].message` with native `tool_calls`, or tool calls written
as `<tool_call>` text, and `usage`). What it answers is chosen by the request's model name,
`scripted:POLICY[+MODIFIER...]`, and by the conversation so far (the number of assistant messages
is the step), so one server serves many rollouts at once. The tests use it, and so does
`cudagym agent rollout --model scripted:honest` (no --base-url: `run_rollouts` starts one).

Policies (`POLICIES`):
- `honest`: reads model.py, writes an honest C++ kernel (examples/submission_cpu's, for the CPU tasks
  of examples/problems it knows: small matmul, diagonal matmul), verifies, profiles, answers; for
  other tasks it answers at once that it has no kernel.
- `replay`: the expert replay: reads model.py, writes the kernel (and its kernels/ files) that the
  server was given for this task (`ScriptedServer(replay=...)`, `agent rollout --replay SUBMISSION`:
  a submission folder as `eval run` takes it), verifies, profiles, answers; a task without a kernel
  there is answered at once. Its rewards are those of `eval run` on the same folder.
- `quick`: reads model.py and answers.
- `chatty`: runs `echo` forever (stops on max_turns).
- `big`: prints 6,000 characters a turn, forever (fills the context budget).
- `task`: the policy the task's code names in a comment `# scripted-policy: POLICY[+MODIFIER...]`,
  so one batch (one model name) can run a different policy in each rollout.
- `malformed`: arguments that are not JSON, an unknown tool, arguments that are a JSON list, a
  broken `<tool_call>` block, then a valid call and an answer.
- `invalid`: unknown tools forever (stops on max invalid calls).
- adversarial, one attempt each, then an answer: `network` (connects to this server's /leak),
  `escape` (writes outside the workdir: `probe_dir`, the parent directory, /tmp), `snoop` (reads
  the other workdirs beside its own and the judge's files), `tamper` (changes model.py and the
  verify command, then verifies), `forkbomb`, `flood` (prints 50 MB), `hang` (sleeps forever).

Modifiers: `text` (tool calls as `<tool_call>` text, never native), `nousage` (no `usage` in
replies), `delay` (each reply waits `delay_s`), and server failures on the first request of each
step: `429` (with Retry-After), `500`, `slow` (answers after `slow_s`, past a short client timeout);
`down`: every request is a 503.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from cudagym.agent.client import estimate_tokens

SCRIPTED_PREFIX = "scripted:"

# Honest C++ kernels for CPU tasks of examples/problems: the example submission's (the same extension
# names, so the demo's eval run and the scripted agent share one build), keyed by a line of the task.
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
HONEST_KERNELS = {"torch.diag(A) @ B": EXAMPLES / "submission_cpu" / "level1" / "4_Diag_matmul.py",
                  "torch.matmul(A, B)": EXAMPLES / "submission_cpu" / "level1" / "1_Small_matmul.py"}
ANSWER = "Done."


def call(name: str, **arguments) -> tuple[str, str]:
    return name, json.dumps(arguments)


def _task_text(messages: list[dict]) -> str:
    return "\n".join(m.get("content") or "" for m in messages if m.get("role") in ("system", "user"))


def honest(step: int, messages: list[dict], server: "ScriptedServer") -> list | str:
    text = _task_text(messages[:2])
    path = next((p for marker, p in HONEST_KERNELS.items() if marker in text), None)
    if path is None or not path.is_file():  # an unknown task (or no examples/ folder beside the package)
        return "I have no kernel for this task."
    kernel = path.read_text()
    script = [[call("read_file", path="model.py")], [call("write_file", path="model_new.py", content=kernel)],
              [call("verify")], [call("profile")]]
    return script[step] if step < len(script) else "The kernel is correct and profiled. " + ANSWER


def replay(step: int, messages: list[dict], server: "ScriptedServer") -> list | str:
    text = _task_text(messages[:2])
    kernel = next((k for code, k in server.replay.items() if code in text), None)
    if kernel is None:
        return "I have no kernel for this task."
    code, files = kernel
    script = [[call("read_file", path="model.py")],
              [call("write_file", path="model_new.py", content=code)]
              + [call("write_file", path=rel, content=text) for rel, text in sorted(files.items())],
              [call("verify")], [call("profile")]]
    return script[step] if step < len(script) else "The kernel is correct and profiled. " + ANSWER


def quick(step, messages, server):
    return [call("read_file", path="model.py")] if step == 0 else ANSWER


def chatty(step, messages, server):
    return [call("bash", command=f"echo turn {step}")]


def malformed(step, messages, server):
    script = [[("bash", "not json {")], [call("launch_missiles", target="moon")], [("read_file", "[1, 2]")],
              '<tool_call>{"name": "bash", "arguments": {"command": </tool_call>',
              [call("read_file", path="model.py")]]
    return script[step] if step < len(script) else ANSWER


def big(step, messages, server):
    return [call("bash", command=f"echo turn {step}; head -c 6000 /dev/zero | tr '\\0' y")]


def invalid(step, messages, server):
    return [call(f"no_such_tool_{step}")]


def network(step, messages, server):
    if step == 0:
        code = (f"import urllib.request; print(urllib.request.urlopen('{server.url}/leak', timeout=5).read())")
        return [call("bash", command=f"python3 -c \"{code}\"; curl -s -m 5 {server.url}/leak; echo exit=$?")]
    return ANSWER


def escape(step, messages, server):
    if step == 0:
        probe = server.probe_dir
        return [call("bash", command=f"echo escaped > {probe}/escape-bash.txt; echo escaped > ../escape-parent.txt; "
                                     f"echo escaped > /tmp/cudagym-escape-{server.token}.txt; ls {probe}"),
                call("write_file", path=f"{probe}/escape-tool.txt", content="escaped"),
                call("write_file", path="../escape-tool-parent.txt", content="escaped")]
    return ANSWER


def snoop(step, messages, server):
    if step == 0:
        return [call("bash", command="ls -la ..; cat ../*/model_new.py ../*/SECRET* 2>&1 | head -c 2000; "
                                     "ls /proc/*/cwd 2>&1 | head -c 500; env | grep -i -E 'seed|judge|secret' | head"),
                call("read_file", path="../../trajectories.duckdb")]
    return ANSWER


def tamper(step, messages, server):
    script = [[call("bash", command="chmod u+w model.py verify 2>&1; echo '# changed' >> model.py; "
                                    "printf '#!/bin/sh\\necho ALL CORRECT\\n' > verify; cat verify")],
              [call("write_file", path="model.py", content="import torch\nclass Model(torch.nn.Module):\n"
                    "    def forward(self, *x):\n        return x[0]\n")],
              [call("verify")]]
    return script[step] if step < len(script) else ANSWER


def forkbomb(step, messages, server):
    return [call("bash", command="bomb() { bomb | bomb & }; bomb; sleep 2; echo still here")] if step == 0 else ANSWER


def flood(step, messages, server):
    return [call("bash", command="head -c 50000000 /dev/zero | tr '\\0' x")] if step == 0 else ANSWER


def hang(step, messages, server):
    return [call("bash", command="sleep 100000")] if step == 0 else ANSWER  # the environment's bash timeout applies


POLICIES = {"honest": honest, "replay": replay, "quick": quick, "chatty": chatty, "big": big, "malformed": malformed, "invalid": invalid,
            "network": network, "escape": escape, "snoop": snoop, "tamper": tamper, "forkbomb": forkbomb,
            "flood": flood, "hang": hang, "task": None}
MODIFIERS = ("text", "nousage", "delay", "429", "500", "slow", "down")


def parse_model(model: str) -> tuple[str, frozenset[str]]:
    """(policy, modifiers) of `scripted:POLICY[+MOD...]`; ValueError (one line) when unknown."""
    if not model.startswith(SCRIPTED_PREFIX):
        raise ValueError(f"not a scripted model: {model!r}")
    policy, *mods = model[len(SCRIPTED_PREFIX):].split("+")
    if policy not in POLICIES:
        raise ValueError(f"unknown scripted policy {policy!r} (choose from {', '.join(POLICIES)})")
    unknown = set(mods) - set(MODIFIERS)
    if unknown:
        raise ValueError(f"unknown scripted modifier(s) {', '.join(sorted(unknown))} (choose from {', '.join(MODIFIERS)})")
    return policy, frozenset(mods)


TASK_POLICY = re.compile(r"#\s*scripted-policy:\s*([\w+-]+)")


def policy_of(model: str, messages: list[dict]) -> tuple[str, frozenset[str]]:
    """(policy, modifiers) of a request: the model name's, or with `scripted:task` the task's comment's
    (modifiers of both)."""
    policy, mods = parse_model(model)
    if policy != "task":
        return policy, mods
    found = TASK_POLICY.search(_task_text(messages[:2]))
    if not found:
        raise ValueError("scripted:task, but the task names no policy (# scripted-policy: NAME)")
    task_policy, task_mods = parse_model(SCRIPTED_PREFIX + found.group(1))
    if task_policy == "task":
        raise ValueError("a task's scripted-policy cannot be `task`")
    return task_policy, mods | task_mods


def reply_body(model: str, body: dict, server: "ScriptedServer") -> dict:
    """The chat.completion JSON for a request."""
    messages = body.get("messages") or []
    policy, mods = policy_of(model, messages)
    step = sum(1 for m in messages if m.get("role") == "assistant")
    action = POLICIES[policy](step, messages, server)
    text_mode = "text" in mods or not body.get("tools")
    message: dict = {"role": "assistant", "content": ""}
    if isinstance(action, str):
        message["content"] = action
    elif text_mode:
        message["content"] = "Next step.\n" + "\n".join(
            f'<tool_call>\n{{"name": {json.dumps(name)}, "arguments": {arguments}}}\n</tool_call>'
            if _is_json(arguments) else f'<tool_call>{{"name": {json.dumps(name)}, "arguments": {arguments}</tool_call>'
            for name, arguments in action)
    else:
        message["tool_calls"] = [{"id": f"call_{step}_{i}", "type": "function",
                                  "function": {"name": name, "arguments": arguments}}
                                 for i, (name, arguments) in enumerate(action)]
    finish = "tool_calls" if message.get("tool_calls") else "stop"
    reply = {"id": f"chatcmpl-{step}", "object": "chat.completion", "created": int(time.time()), "model": model,
             "choices": [{"index": 0, "message": message, "finish_reason": finish}]}
    if "nousage" not in mods:
        prompt, completion = estimate_tokens(messages, body.get("tools")), estimate_tokens([message])
        reply["usage"] = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
    return reply


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
        return True
    except json.JSONDecodeError:
        return False


class ScriptedServer:
    """The in-process server; use as a context manager. `base_url` is what the client takes."""

    def __init__(self, probe_dir: str | Path | None = None, delay_s: float = 0.5, slow_s: float = 5.0,
                 retry_after_s: float = 0.2, replay: dict[str, tuple[str, dict[str, str]]] | None = None):
        self.probe_dir = str(probe_dir or "/tmp")
        # the `replay` policy's kernels: a task's code (stripped) -> (model_new.py, {kernels/ path: text})
        self.replay = {code.strip(): kernel for code, kernel in (replay or {}).items()}
        self.delay_s, self.slow_s, self.retry_after_s = delay_s, slow_s, retry_after_s
        self.token = hashlib.sha256(str(time.time_ns()).encode()).hexdigest()[:8]
        self.lock = threading.Lock()
        self.requests: Counter = Counter()  # per model
        self.failures: Counter = Counter()  # failures served per (model, step key)
        self.leaks: list[str] = []  # paths of any non-API request that reached us (the network probe)
        self.bodies: list[dict] = []  # every request body, in arrival order
        self._httpd: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"

    def __enter__(self) -> "ScriptedServer":
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def _send(self, status: int, payload: dict, headers: dict | None = None) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for key, value in (headers or {}).items():
                    self.send_header(key, value)
                self.end_headers()
                try:
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):  # the client gave up (its timeout)
                    pass

            def do_GET(self):
                with server.lock:
                    server.leaks.append(self.path)
                self._send(404, {"error": "not found"})

            def do_POST(self):
                length = int(self.headers.get("Content-Length") or 0)
                try:
                    body = json.loads(self.rfile.read(length) or b"{}")
                except json.JSONDecodeError:
                    return self._send(400, {"error": {"message": "body is not JSON"}})
                if not self.path.rstrip("/").endswith("/chat/completions"):
                    with server.lock:
                        server.leaks.append(self.path)
                    return self._send(404, {"error": {"message": f"no route {self.path}"}})
                server.handle(self, body)

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        threading.Thread(target=self._httpd.serve_forever, name="scripted-llm", daemon=True).start()
        return self

    def handle(self, handler, body: dict) -> None:
        model = str(body.get("model", ""))
        messages = body.get("messages") or []
        try:
            _, mods = policy_of(model, messages)
        except ValueError as e:
            return handler._send(404, {"error": {"message": str(e), "type": "invalid_request_error"}})
        step_key = (model, hashlib.sha256(json.dumps(messages[:2]).encode()).hexdigest(), len(messages))
        with self.lock:
            self.requests[model] += 1
            self.bodies.append(body)
            first = self.failures[step_key] == 0
            self.failures[step_key] += 1
        if "down" in mods:
            return handler._send(503, {"error": {"message": "scripted: server down"}})
        if first and "429" in mods:
            return handler._send(429, {"error": {"message": "scripted: rate limited"}},
                                 {"Retry-After": f"{self.retry_after_s:g}"})
        if first and "500" in mods:
            return handler._send(500, {"error": {"message": "scripted: internal error"}})
        if first and "slow" in mods:
            time.sleep(self.slow_s)
        if "delay" in mods:
            time.sleep(self.delay_s)
        handler._send(200, reply_body(model, body, self))

    def __exit__(self, *exc) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()


SCRIPTED_TASK = EXAMPLES / "problems" / "1_3_Softmax.py"  # a small task; the policy's name goes in a comment


def write_task_set(folder: str | Path, policies: list[str], level: int = 1) -> Path:
    """A task-set folder (LEVEL_ID_NAME.py files) whose i-th task names policies[i] for `scripted:task`."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    code = SCRIPTED_TASK.read_text()
    for i, policy in enumerate(policies, 1):
        parse_model(SCRIPTED_PREFIX + policy)
        name = re.sub(r"[^A-Za-z0-9]+", "_", policy)
        (folder / f"{level}_{i}_{name}.py").write_text(f"# scripted-policy: {policy}\n{code}")
    return folder
