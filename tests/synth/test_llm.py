"""The llm composer (cudagym/synth/llm.py), end to end against a real local OpenAI-compatible server.

openai uses httpx2, which respx cannot intercept, so the tests start a `ThreadingHTTPServer` on
127.0.0.1 that answers POST /v1/chat/completions and talk to it with the real `openai` client.
The server's behaviour is picked by the request's model name (`<behaviour>/<unique id>`); its
"good" answer is a real fused module built from the operators the prompt lists.
"""

from __future__ import annotations

import itertools
import json
import re
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from cudagym.synth.compose import COMPOSERS, ComposeConfig, ComposeStep, Reject, ops_from_code
from cudagym.synth.crawl import InputSpec, Seed
from cudagym.synth.llm import (
    ALLOWED_IMPORTS,
    PLACEHOLDER_API_KEY,
    REJECT_REASONS,
    LLMComposer,
    LLMConfig,
    build_prompt,
    parse_answer,
    retry_after_s,
)
from cudagym.tasks import Task

pytestmark = pytest.mark.timeout(60)

USAGE = {"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120}  # per answer, from the server
MAX_REQUESTS = 400  # the server refuses more: a runaway retry loop fails the test instead of hanging


def _seed(qualified_name: str, name: str, call: str, ops: tuple[str, ...], family: str, modules=()) -> Seed:
    return Seed(qualified_name=qualified_name, kind="nn_module" if modules else "functional", call=call,
                inputs=(InputSpec("x", ("B", "I")),), modules=modules, family=family, name=name, ops=ops)


LINEAR = _seed("torch.nn.Linear", "Linear", "self.op(x)", ("Linear",), "linear", (("op", "nn.Linear(I, J)"),))
RELU = _seed("torch.relu", "ReLU", "torch.relu(x)", ("relu",), "activation")
TANH = _seed("torch.tanh", "Tanh", "torch.tanh(x)", ("tanh",), "activation")
SOFTMAX = _seed("torch.softmax", "Softmax", "torch.softmax(x, dim=-1)", ("softmax",), "reduction")
SIGMOID = _seed("torch.sigmoid", "Sigmoid", "torch.sigmoid(x)", ("sigmoid",), "activation")
SEEDS = [LINEAR, RELU, TANH, SOFTMAX, SIGMOID]

# --------------------------------------------------------------------------------------------
# The fake LLM
# --------------------------------------------------------------------------------------------

# operator -> (line for __init__ or None, line for forward); {i} is the operator's position
FAKE_LINES = {
    "torch.nn.Linear": ("self.linear{i} = nn.Linear(features, features)", "x = self.linear{i}(x)"),
    "torch.relu": (None, "x = torch.relu(x)"),
    "torch.tanh": (None, "x = torch.tanh(x)"),
    "torch.softmax": (None, "x = torch.softmax(x, dim=-1)"),
    "torch.sigmoid": (None, "x = torch.sigmoid(x)"),
}


def fused_module(operators: list[str], extra_import: str = "", inputs: bool = True) -> str:
    """A valid KernelBench task applying `operators` (keys of FAKE_LINES) in order."""
    init = ["super().__init__()"]
    init += [FAKE_LINES[op][0].format(i=i) for i, op in enumerate(operators) if FAKE_LINES[op][0]]
    forward = [FAKE_LINES[op][1].format(i=i) for i, op in enumerate(operators)] + ["return x"]
    lines = ["import torch", "import torch.nn as nn", *([extra_import] if extra_import else []), "", "",
             "class Model(nn.Module):",
             '    """Fuses Conv3d and GELU."""  # what the model claims; the AST says otherwise', "",
             "    def __init__(self, features):", *[f"        {line}" for line in init], "",
             "    def forward(self, x):", "        # ops: Conv3d, gelu", *[f"        {line}" for line in forward],
             "", "", "batch_size = 4", "features = 64", "", ""]
    if inputs:
        lines += ["def get_inputs():", "    return [torch.randn(batch_size, features)]", "", ""]
    lines += ["def get_init_inputs():", "    return [features]", ""]
    return "\n".join(lines)


def good_answer(operators: list[str], **kwargs) -> str:
    return ("Sure! This fuses a Conv3d with a GELU activation.\n\n```python\n" + fused_module(operators, **kwargs)
            + "```\n\nops: [\"Conv3d\", \"gelu\"]\n")


@dataclass
class Reply:
    status: int = 200
    content: str = ""
    delay_s: float = 0.0
    headers: dict = field(default_factory=dict)
    finish_reason: str = "stop"


def listed_operators(prompt: str) -> list[str]:
    return re.findall(r"^\d+\. `([\w.]+)`", prompt, re.MULTILINE)


class FakeLLM:
    """Chooses a reply by behaviour (the model name's prefix) and counts requests per model."""

    def __init__(self):
        self.lock = threading.Lock()
        self.requests: dict[str, list[dict]] = defaultdict(list)
        self.in_flight: Counter = Counter()
        self.max_in_flight: Counter = Counter()
        self.answered: dict[str, list[str]] = defaultdict(list)  # prompts whose reply was sent in full
        self.total = 0
        self.die_after: int | None = None  # the server stops listening after this many requests
        self.not_found = 0  # requests to a path the server does not serve (a wrong base URL)

    def count(self, model: str) -> int:
        with self.lock:
            return len(self.requests[model])

    def reply(self, body: dict) -> Reply:
        model = body["model"]
        behaviour = model.split("/")[0]
        with self.lock:
            self.total += 1
            n = len(self.requests[model])  # earlier requests for this model
            self.requests[model].append(body)
            if self.total > MAX_REQUESTS:
                return Reply(400, "too many requests in one test session")
        if behaviour == "fixed":  # one module whatever the prompt asks for (the build test's crawled seeds)
            return Reply(content=good_answer(["torch.nn.Linear", "torch.tanh"]))
        if behaviour == "slowfixed":
            return Reply(content=good_answer(["torch.nn.Linear", "torch.tanh"]), delay_s=1.0)
        if behaviour == "chat-styles":  # how chat models wrap code: tags, prose, several blocks, none
            code = fused_module(["torch.nn.Linear", "torch.relu"])
            return Reply(content=[
                f"Here it is:\n<code class=\"language-python\">{code.replace('<', '&lt;')}</code>\nEnjoy.",
                f"<think>First draft:\n```python\nclass Model: pass\n```</think>\nFinal program:\n\n{code}\n"
                "This applies Linear then ReLU.",
                f"```bash\npip install torch\n```\n```python\n{code}```\nUsage:\n```python\n"
                "model = Model(*get_init_inputs())\n```\n"][n % 3])
        prompt = body["messages"][-1]["content"]
        ops = listed_operators(prompt)
        good = good_answer(ops if all(op in FAKE_LINES for op in ops) else ["torch.relu"])  # crawled seeds: a stand-in
        if behaviour == "good":
            return Reply(content=good)
        if behaviour == "flaky-tanh":  # a malformed answer whenever tanh is asked for
            return Reply(content="I would rather not." if "torch.tanh" in ops else good)
        if behaviour == "no-code":
            return Reply(content="The fused model applies Linear then ReLU: Model(x) = relu(linear(x)).")
        if behaviour == "syntax":
            return Reply(content="```python\nimport torch\nclass Model(nn.Module:\n    pass\n```")
        if behaviour == "no-inputs":
            return Reply(content=good_answer(ops, inputs=False))
        if behaviour == "bad-import":
            return Reply(content=good_answer(ops, extra_import="import os"))
        if behaviour == "two-blocks":
            return Reply(content=good + "\nUsage:\n```python\nmodel = Model(*get_init_inputs())\n```\n")
        if behaviour == "no-ops":
            return Reply(content=good_answer([]))
        if behaviour == "truncated":
            return Reply(content=good[:200], finish_reason="length")
        if behaviour == "rate-limit-once":
            return Reply(429, headers={"retry-after-ms": "300"}) if n == 0 else Reply(content=good)
        if behaviour == "rate-limit":
            return Reply(429, headers={"retry-after": "0"})
        if behaviour == "slow-once":
            return Reply(content=good, delay_s=1.0 if n == 0 else 0.0)
        if behaviour == "slow-always":
            return Reply(content=good, delay_s=1.0)
        if behaviour == "slow":
            return Reply(content=good, delay_s=0.3)
        if behaviour == "error-500":
            return Reply(500)
        if behaviour == "bad-request":
            return Reply(400)
        raise AssertionError(f"unknown behaviour {behaviour!r}")


class _Handler(BaseHTTPRequestHandler):
    server: "_Server"

    def log_message(self, *args) -> None:  # quiet
        pass

    def do_GET(self) -> None:  # the client's health check
        if self.path.startswith("/noauth/"):
            self._send(401, {"error": {"message": "invalid api key", "type": "invalid_request_error"}})
        elif self.path == "/v1/models":
            self._send(200, {"object": "list", "data": [{"id": "any", "object": "model", "owned_by": "test"}]})
        else:
            self._not_found()

    def _not_found(self) -> None:
        with self.server.fake.lock:
            self.server.fake.not_found += 1
        self._send(404, {"error": {"message": "not found"}})

    def do_POST(self) -> None:
        if self.path.startswith("/noauth/"):
            self._send(401, {"error": {"message": "invalid api key", "type": "invalid_request_error"}})
            return
        if self.path != "/v1/chat/completions":
            self._not_found()
            return
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        fake = self.server.fake
        reply = fake.reply(body)
        model = body["model"]
        with fake.lock:
            fake.in_flight[model] += 1
            fake.max_in_flight[model] = max(fake.max_in_flight[model], fake.in_flight[model])
        try:
            time.sleep(reply.delay_s)
            if reply.status != 200:
                self._send(reply.status, {"error": {"message": f"status {reply.status}", "type": "fake_error"}},
                           reply.headers)
                return
            self._send(200, {
                "id": f"chatcmpl-{fake.total}", "object": "chat.completion", "created": int(time.time()),
                "model": model, "usage": USAGE,
                "choices": [{"index": 0, "finish_reason": reply.finish_reason,
                             "message": {"role": "assistant", "content": reply.content}}]})
            with fake.lock:
                fake.answered[model].append(body["messages"][-1]["content"])
        except OSError:  # the client gave up (timeout) and closed the connection
            pass
        finally:
            with fake.lock:
                fake.in_flight[model] -= 1
                dying = fake.die_after is not None and fake.total >= fake.die_after
            if dying:  # an endpoint that dies mid-run: new connections are refused from now on
                threading.Thread(target=lambda: (self.server.shutdown(), self.server.server_close()), daemon=True).start()

    def _send(self, status: int, payload: dict, headers: dict | None = None) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    fake: FakeLLM


def start_server(die_after: int | None = None) -> _Server:
    httpd = _Server(("127.0.0.1", 0), _Handler)
    httpd.fake = FakeLLM()
    httpd.fake.die_after = die_after
    httpd.thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    httpd.thread.start()
    httpd.base_url = f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    return httpd


def stop_server(httpd: _Server) -> None:
    httpd.shutdown()
    httpd.server_close()
    httpd.thread.join(5)


@pytest.fixture(scope="module")
def server():
    httpd = start_server()
    yield httpd
    stop_server(httpd)


_ids = itertools.count()


def _config(server, behaviour: str, **overrides) -> LLMConfig:
    """Short timeouts and backoffs; a model name unique to the call, so request counts are per test."""
    settings = dict(model=f"{behaviour}/{next(_ids)}", base_url=server.base_url, api_key="test-key", timeout_s=5.0,
                    max_retries=2, backoff_s=0.001, max_backoff_s=0.5, concurrency=2)
    return LLMConfig(**(settings | overrides))


def _compose(config: LLMConfig, seeds=(LINEAR, RELU), **kwargs) -> tuple[Task | Reject, LLMComposer]:
    composer = LLMComposer(llm=config)
    result = composer.compose_batch([(list(seeds), len(seeds))])[0]
    composer.close()
    return result, composer


# --------------------------------------------------------------------------------------------
# Config, prompt, parsing (no server)
# --------------------------------------------------------------------------------------------


def test_config_from_env_and_checks(monkeypatch):
    for name in ("CUDAGYM_LLM_MODEL", "CUDAGYM_LLM_BASE_URL", "OPENAI_BASE_URL", "CUDAGYM_LLM_API_KEY",
                 "OPENAI_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ValueError, match="no LLM model"):
        LLMConfig()
    monkeypatch.setenv("CUDAGYM_LLM_MODEL", "qwen")
    with pytest.raises(ValueError, match="no LLM endpoint"):
        LLMConfig()
    monkeypatch.setenv("OPENAI_BASE_URL", "http://localhost:8000/v1")
    config = LLMConfig()
    assert (config.model, config.base_url, config.api_key) == ("qwen", "http://localhost:8000/v1", PLACEHOLDER_API_KEY)
    monkeypatch.setenv("CUDAGYM_LLM_BASE_URL", "http://127.0.0.1:9/v1")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret")
    config = LLMConfig()
    assert config.base_url == "http://127.0.0.1:9/v1" and config.api_key == "sk-secret"
    assert "sk-secret" not in repr(config)
    for bad, message in [({"concurrency": 0}, "concurrency"), ({"max_retries": -1}, "max_retries"),
                         ({"timeout_s": 0}, "timeout_s"), ({"temperature": 3}, "temperature"),
                         ({"max_tokens": 0}, "max_tokens"), ({"backoff_s": 2, "max_backoff_s": 1}, "backoff"),
                         ({"base_url": "localhost:8000"}, "http")]:
        with pytest.raises(ValueError, match=message):
            LLMConfig(**bad)
    assert COMPOSERS["llm"] is LLMComposer
    assert ComposeConfig(composer="llm", llm=config).llm is config


def test_prompt_lists_the_seeds_and_the_format():
    prompt = build_prompt([LINEAR, RELU])
    assert listed_operators(prompt) == ["torch.nn.Linear", "torch.relu"]
    assert "`nn.Linear(64, 128)`" in prompt and "`torch.relu(x)`" in prompt  # seed_snippet at scale 1
    for required in ("class Model(nn.Module)", "get_inputs()", "get_init_inputs()", "```python", "2 operator(s)"):
        assert required in prompt
    llama = Seed(qualified_name="transformers.models.llama.modeling_llama.LlamaMLP", kind="transformers_block",
                 call="self.op(x)", inputs=(InputSpec("x", ("B", "S", "E")),), modules=(("op", "LlamaMLP(cfg)"),),
                 config="LlamaConfig(hidden_size=E)", name="LlamaMLP", ops=("LlamaMLP",),
                 imports=("from transformers.models.llama.modeling_llama import LlamaMLP",))
    assert "`from transformers.models.llama.modeling_llama import LlamaMLP`" in build_prompt([llama, RELU])


def test_parse_answer_accepts_one_python_block():
    code = parse_answer(good_answer(["torch.nn.Linear", "torch.relu"]))
    assert isinstance(code, str) and code.startswith("import torch\n") and code.endswith("return [features]\n")
    assert ops_from_code(code) == ["Linear", "relu"]
    # another language's block is not a candidate; `from torch import nn` is allowed
    text = "```bash\npip install torch\n```\n" + good_answer(["torch.relu"]).replace(
        "import torch.nn as nn", "from torch import nn")
    assert isinstance(parse_answer(text), str)


@pytest.mark.parametrize("text, reason", [
    ("no code at all", "llm_no_code"),
    ("```python\nimport torch\nclass Model(nn.Module):\n", "llm_no_code"),  # unclosed fence (truncated)
    ("```python\n\n```", "llm_no_code"),
    ("```python\nx = 1\n```\n```python\ny = 2\n```", "llm_ambiguous"),
    ("```python\ndef f(:\n```", "llm_syntax"),
    (good_answer(["torch.relu"], extra_import="import subprocess"), "llm_bad_import"),
    (good_answer(["torch.relu"], extra_import="from torch.utils.cpp_extension import load_inline"),
     "llm_bad_import"),
    (good_answer(["torch.relu"]).replace("return [features]", "import os\n    return [features]"),
     "llm_bad_import"),  # an import inside a function counts too
    (good_answer(["torch.relu"]).replace("x = torch.relu(x)", "x = __import__('os').getpid() + x"),
     "llm_bad_import"),
    (good_answer(["torch.relu"], extra_import="from . import helpers"), "llm_bad_import"),
    (good_answer(["torch.relu"]).replace("class Model(", "class ModelNew("), "llm_model_new"),
    (good_answer(["torch.relu"]).replace("class Model(nn.Module)", "class Net(nn.Module)"), "llm_missing_model"),
    (good_answer(["torch.relu"]).replace("class Model(nn.Module)", "class Model(object)"), "llm_missing_model"),
    (good_answer(["torch.relu"]).replace("def forward", "def run"), "llm_missing_model"),
    (good_answer(["torch.relu"], inputs=False), "llm_missing_inputs"),
    (good_answer(["torch.relu"]).replace("def get_init_inputs", "def get_init_args"), "llm_missing_inputs"),
])
def test_parse_answer_rejects(text, reason):
    result = parse_answer(text)
    assert isinstance(result, Reject) and result.reason == reason, result
    assert reason in REJECT_REASONS and result.detail


def test_seed_imports_are_allowed_for_their_seeds_only():
    text = good_answer(["torch.relu"], extra_import="from transformers.activations import GELUActivation")
    assert parse_answer(text).reason == "llm_bad_import"
    assert isinstance(parse_answer(text, ALLOWED_IMPORTS | {"transformers.activations"}), str)


def test_retry_after_header_forms():
    assert retry_after_s({"retry-after-ms": "250"}) == 0.25
    assert retry_after_s({"retry-after": "2"}) == 2.0
    assert 0 < retry_after_s({"retry-after": time.strftime("%a, %d %b %Y %H:%M:%S GMT",
                                                           time.gmtime(time.time() + 30))}) <= 31
    assert retry_after_s({"retry-after": "soon"}) is None and retry_after_s({}) is None


# --------------------------------------------------------------------------------------------
# End to end against the local server
# --------------------------------------------------------------------------------------------


def test_good_answer_becomes_a_task_labelled_from_its_ast(server):
    config = _config(server, "good")
    task, composer = _compose(config)
    assert isinstance(task, Task), task
    # the answer's prose and comments claim Conv3d/GELU; the labels come from the code
    assert task.provenance["ops"] == ops_from_code(task.code) == ["Linear", "relu"]
    assert task.provenance["data_source"] == "torch#2"
    assert task.code == fused_module(["torch.nn.Linear", "torch.relu"])
    assert task.id == f"synth/{task.sha256[:12]}" and task.name == "Linear_ReLU"
    assert task.level == 2 and task.source == "synth:llm"
    prov = task.provenance
    assert prov["composer"] == "llm" and prov["model"] == config.model and prov["k"] == 2
    assert prov["seed_ids"] == ["torch.nn.Linear", "torch.relu"] and prov["seed_ops"] == ["Linear", "relu"]
    assert prov["missing_seed_ops"] == [] and prov["usage"] == USAGE
    assert prov["cached"] is False and prov["attempts"] == 1
    (request,) = server.fake.requests[config.model]
    assert request["max_tokens"] == config.max_tokens and request["temperature"] == config.temperature
    assert listed_operators(request["messages"][-1]["content"]) == ["torch.nn.Linear", "torch.relu"]
    assert request["messages"][0]["role"] == "system"
    assert composer.stats["requests"] == 1 and composer.stats["retries"] == 0
    assert {k: composer.stats[k] for k in USAGE} == USAGE
    # K=1 is level 1
    task, _ = _compose(_config(server, "good"), seeds=[SOFTMAX])
    assert task.level == 1 and task.provenance["ops"] == ["softmax"] and task.provenance["data_source"] == "torch#1"


@pytest.mark.parametrize("behaviour, reason", [
    ("no-code", "llm_no_code"), ("syntax", "llm_syntax"), ("no-inputs", "llm_missing_inputs"),
    ("bad-import", "llm_bad_import"), ("no-ops", "llm_label_empty"),
    ("truncated", "llm_truncated"),
])
def test_malformed_answers_are_rejects(server, behaviour, reason):
    config = _config(server, behaviour)
    result, composer = _compose(config)
    assert isinstance(result, Reject) and result.reason == reason, result
    assert server.fake.count(config.model) == 1 and composer.stats["retries"] == 0  # an answer is not retried
    assert composer.stats["total_tokens"] == USAGE["total_tokens"]  # but its tokens were spent


def test_rate_limit_retry_after_is_honoured_then_success(server):
    config = _config(server, "rate-limit-once")
    start = time.monotonic()
    task, composer = _compose(config)
    elapsed = time.monotonic() - start
    assert isinstance(task, Task), task
    assert server.fake.count(config.model) == 2
    assert composer.stats["retries"] == 1 and composer.stats["errors_llm_rate_limited"] == 1
    assert task.provenance["attempts"] == 2
    assert elapsed >= 0.28  # waited the 300 ms the server asked for, not the 1 ms backoff
    assert composer.stats["total_tokens"] == USAGE["total_tokens"]  # the 429 cost no tokens


def test_rate_limit_exhausts_retries(server):
    config = _config(server, "rate-limit", max_retries=3)
    result, composer = _compose(config)
    assert isinstance(result, Reject) and result.reason == "llm_rate_limited", result
    assert "4 attempts" in result.detail
    assert server.fake.count(config.model) == 4 and composer.stats["retries"] == 3


def test_a_timeout_is_not_retried(server):
    """A server slower than the timeout is still working on the request: asking again would double
    its queue (the retry storm a one-slot local server suffered). One attempt, a clear reason."""
    config = _config(server, "slow-always", timeout_s=0.3, max_retries=3)
    result, composer = _compose(config)
    assert isinstance(result, Reject) and result.reason == "llm_timeout", result
    assert "--llm-timeout" in result.detail
    assert server.fake.count(config.model) == 1 and composer.stats["retries"] == 0
    # a timeout that suits the server gets the answer
    task, _ = _compose(_config(server, "slow-once", timeout_s=5.0))
    assert isinstance(task, Task), task


def test_chat_styles_of_wrapping_code_all_parse(server):
    """<code> tags (HTML-escaped), bare code with prose around it after a <think> draft, several blocks of
    which one defines Model: each answer gives the same program."""
    config = _config(server, "chat-styles", concurrency=1)
    composer = LLMComposer(llm=config)
    pairs = [[LINEAR, RELU], [RELU, LINEAR], [LINEAR, TANH]]
    results = composer.compose_batch([(p, 2) for p in pairs])
    composer.close()
    assert all(isinstance(r, Task) for r in results), results
    assert {r.code for r in results} == {fused_module(["torch.nn.Linear", "torch.relu"])}
    assert all(r.provenance["ops"] == ["Linear", "relu"] for r in results)


def test_persistent_500_exhausts_retries_and_is_not_cached(server, tmp_path):
    config = _config(server, "error-500", max_retries=3, cache_path=str(tmp_path / "cache.duckdb"))
    for n in (1, 2):
        result, composer = _compose(config)
        assert isinstance(result, Reject) and result.reason == "llm_error", result
        assert "4 attempts" in result.detail and "InternalServerError" in result.detail
        assert composer.stats["errors_llm_error"] == 4 and composer.stats["retries"] == 3
        assert composer.stats["cache_hits"] == 0
        assert server.fake.count(config.model) == 4 * n  # an API error is never cached
    # a status that retrying cannot fix is not retried
    config = _config(server, "bad-request", max_retries=3)
    result, composer = _compose(config)
    assert result.reason == "llm_error" and server.fake.count(config.model) == 1
    assert composer.stats["retries"] == 0


def test_cache_hit_makes_no_request(server, tmp_path):
    cache = str(tmp_path / "llm.duckdb")
    config = _config(server, "good", cache_path=cache)
    composer = LLMComposer(llm=config)
    first, second = (composer.compose_batch([([LINEAR, RELU], 2)])[0] for _ in range(2))
    assert server.fake.count(config.model) == 1
    assert first.code == second.code and first.provenance["cached"] is False and second.provenance["cached"] is True
    assert second.provenance["usage"] == USAGE and second.provenance["attempts"] == 0
    assert composer.stats["cache_hits"] == 1 and composer.stats["cache_misses"] == 1
    assert composer.stats["total_tokens"] == USAGE["total_tokens"]  # a hit spends nothing
    assert len(composer.client.cache) == 1
    composer.close()
    # the file persists: a new composer (a rerun) asks nothing either; another prompt is a miss
    composer = LLMComposer(llm=config)
    again = composer.compose_batch([([LINEAR, RELU], 2), ([RELU, LINEAR], 2)])
    composer.close()
    assert again[0].code == first.code and again[0].provenance["cached"] is True
    assert again[1].provenance["cached"] is False and server.fake.count(config.model) == 2
    # malformed answers are answers: cached too
    config = _config(server, "no-code", cache_path=cache)
    assert [_compose(config)[0].reason for _ in range(2)] == ["llm_no_code"] * 2
    assert server.fake.count(config.model) == 1


def test_concurrency_is_bounded_and_order_kept(server):
    config = _config(server, "slow", concurrency=2)
    composer = LLMComposer(llm=config)
    pairs = [(a, b) for a in SEEDS for b in SEEDS if a is not b][:6]
    start = time.monotonic()
    results = composer.compose_batch([([a, b], 2) for a, b in pairs])
    elapsed = time.monotonic() - start
    composer.close()
    assert server.fake.count(config.model) == 6
    assert server.fake.max_in_flight[config.model] == 2  # never more than 2, and more than 1
    assert [r.provenance["seed_ids"] for r in results] == [[a.id, b.id] for a, b in pairs]
    assert elapsed >= 0.85  # 6 requests of 0.3 s, 2 at a time
    assert composer.stats["total_tokens"] == 6 * USAGE["total_tokens"]


def test_compose_step_with_llm_composer(server):
    llm = _config(server, "flaky-tanh", concurrency=3)
    config = ComposeConfig(composer="llm", n_tasks=5, k_distribution={1: 0.3, 2: 0.7}, seed=3, llm=llm)
    step = ComposeStep(config)
    tasks = list(step.run(SEEDS))
    assert len(tasks) == 5 and len({t.sha256 for t in tasks}) == 5
    assert all(t.source == "synth:llm" and t.provenance["ops"] == ops_from_code(t.code) for t in tasks)
    assert all("tanh" not in t.provenance["ops"] for t in tasks)  # the fake LLM refuses tanh
    stats = step.stats
    assert stats["kept"] == 5 and stats["k1"] + stats["k2"] == 5
    assert stats["dropped_llm_no_code"] >= 1  # seed 3 draws tanh at least once; the K is drawn again
    assert stats["in"] == stats["kept"] + sum(v for key, v in stats.items() if key.startswith("dropped_"))
    assert all(r.reason in REJECT_REASONS for r in step.rejects)
    assert step.composer_stats["requests"] == server.fake.count(llm.model) <= stats["in"]
    assert server.fake.max_in_flight[llm.model] <= 3
    # deterministic given the seed (the answers being the same)
    again = ComposeStep(config)
    assert [t.id for t in again.run(SEEDS)] == [t.id for t in tasks]
    assert again.stats == stats


@pytest.mark.slow
@pytest.mark.timeout(400)  # crawl and a sandboxed filter with torch.compile, on a busy 2-core box
def test_dataset_build_cli_with_the_llm_composer(server, tmp_path, kernelbench_path, capsys):
    """End to end: CLI flags -> LLM composer -> dedup, decontamination, the sandboxed filter -> rows."""
    from cudagym.cli import main
    from cudagym.synth.publish import read_build_rows

    out = tmp_path / "build"
    argv = ["dataset", "build", "--out", str(out), "--composer", "llm", "--model", "fixed/build",
            "--base-url", server.base_url, "--api-key", "test-key", "--llm-timeout", "5", "--max-retries", "1",
            "--concurrency", "2", "--target", "1", "--device", "cpu", "--parallel", "1", "--no-transformers",
            "--k-distribution", "2:1"]
    assert main(argv) == 0, capsys.readouterr().err
    (row,) = read_build_rows(out / "dataset")
    assert row["composer"] == "llm" and row["model"] == "fixed/build"
    assert row["ops"] == ops_from_code(row["code"]) == ["Linear", "tanh"]  # from the AST, not the answer's claims
    assert row["eager_ms"] > 0 and (out / "llm_cache.duckdb").is_file()
    requests = server.fake.count("fixed/build")
    assert main(argv) == 0  # resumed: nothing composed, so no request
    assert server.fake.count("fixed/build") == requests


# --------------------------------------------------------------------------------------------
# How a build with the llm composer ends, for a user of a slow local model or a flaky hosted one:
# one clear line, funnel.json written, nothing already answered lost, progress on stderr.
# --------------------------------------------------------------------------------------------


def _build_argv(out, base_url: str, model: str, *extra: str) -> list[str]:
    return ["dataset", "build", "--out", str(out), "--composer", "llm", "--model", model, "--base-url", base_url,
            "--api-key", "test-key", "--llm-timeout", "10", "--max-retries", "1", "--target", "3", "--device", "cpu",
            "--parallel", "1", "--no-transformers", "--k-distribution", "2:1", *extra]


def _funnel(out) -> dict:
    return json.loads((out / "funnel.json").read_text())


def _error_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("cudagym: ")]


def _cached_prompts(out) -> set[str]:
    import duckdb

    with duckdb.connect(str(out / "llm_cache.duckdb"), read_only=True) as con:
        return {row[0] for row in con.execute("SELECT prompt FROM llm_responses").fetchall()}


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize("base, words", [
    ("http://127.0.0.1:{dead}/v1", "does not answer"),  # nothing listening: connection refused
    ("{server}/wrong/v1", "HTTP 404"),  # a server, but not this path
    ("{noauth}/v1", "refused the API key"),
])
@pytest.mark.timeout(400)  # the first build of the module crawls torch (tens of seconds on a busy box)
def test_build_fails_fast_on_a_dead_or_wrong_endpoint(server, tmp_path, capsys, base, words):
    from cudagym.cli import main

    root = server.base_url.removesuffix("/v1")
    url = base.format(dead=_free_port(), server=root, noauth=f"{root}/noauth")
    out = tmp_path / "build"
    start = time.monotonic()
    model = f"good/{next(_ids)}"
    assert main(_build_argv(out, url, model, "--concurrency", "4")) == 3
    assert time.monotonic() - start < 120  # not 825 s of silence: one health check, no request after it
    err = capsys.readouterr().err
    (line,) = _error_lines(err)
    assert words in line and len(line) < 400 and "Keys mismatch" not in err
    funnel = _funnel(out)
    assert funnel["status"] == "stopped" and funnel["stopped"] == "endpoint_unreachable" and words in funnel["note"]
    assert "0 rows kept" in funnel["note"] and not (out / "dataset").exists()
    assert server.fake.count(model) <= 1  # the 404 case's one-token probe; the 4 workers waited for the check
    assert funnel["versions"]["transformers"] and funnel["versions"]["python"]
    with duckdb_store(out) as db:  # the round is not marked finished
        assert db.execute("SELECT count(*) FROM compose_rounds").fetchone()[0] == 0


def duckdb_store(out):
    import duckdb

    return duckdb.connect(str(out / "build.duckdb"), read_only=True)


@pytest.mark.slow
@pytest.mark.timeout(400)  # the first build of the module crawls torch (tens of seconds on a busy box)
def test_build_stops_when_the_endpoint_dies_and_a_rerun_asks_only_what_is_new(server, tmp_path, capsys):
    from cudagym.cli import main

    dying = start_server(die_after=3)  # answers three requests, then refuses connections
    out, model = tmp_path / "build", f"fixed/{next(_ids)}"
    argv = _build_argv(out, dying.base_url, model, "--llm-max-failures", "3", "--target", "20")
    assert main(argv) == 3
    err = capsys.readouterr().err
    (line,) = _error_lines(err)
    assert "stopped answering" in line and "3 attempts in a row" in line
    assert re.search(r"compose round 0: asked \d+, answered \d+, parsed \d+, kept 1, rejected .*LLM calls \d+", err)
    funnel = _funnel(out)
    assert funnel["status"] == "stopped" and funnel["stopped"] == "endpoint_down"
    answered = set(dying.fake.answered[model])
    assert len(answered) == 3 and _cached_prompts(out) == answered  # every answer kept
    with duckdb_store(out) as db:
        assert db.execute("SELECT count(*) FROM compose_rounds").fetchone()[0] == 0  # not marked finished
    stop_server(dying)
    # the endpoint is back (another server, same model): the rerun answers the first three from the cache
    assert main(_build_argv(out, server.base_url, model, "--llm-max-failures", "3", "--target", "20",
                            "--max-llm-calls", "2")) == 3
    err = capsys.readouterr().err
    assert "--max-llm-calls 2 spent" in _error_lines(err)[0] and "3 cached" in err
    asked_again = [body["messages"][-1]["content"] for body in server.fake.requests[model]]
    assert len(asked_again) == 2 and not set(asked_again) & answered


@pytest.mark.timeout(400)  # the first build of the module crawls torch (tens of seconds on a busy box)
def test_zero_rows_write_the_funnel_and_say_why(server, tmp_path, capsys):
    from cudagym.cli import main
    from cudagym.synth.build import BuildConfig, build_dataset

    out = tmp_path / "build"
    llm = _config(server, "no-code", cache_path=str(out / "llm_cache.duckdb"))
    funnel = build_dataset(BuildConfig(out=str(out), composer="llm", target=1, transformers=False, max_rounds=1,
                                       k_distribution={2: 1.0}, llm=llm))
    compose = funnel["stages"][1]
    assert compose["stage"] == "compose" and compose["kept"] == 0 and compose["dropped"] == {"llm_no_code": compose["in"]}
    assert funnel["status"] == "short" and "stopped" not in funnel
    assert funnel["note"] == f"0 rows kept: compose kept 0 of {compose['in']} (llm_no_code {compose['in']}); no dataset written"
    assert _funnel(out) == funnel and not (out / "dataset").exists()
    with duckdb_store(out) as db:  # each round records the versions it composed under
        (stats,) = db.execute("SELECT stats FROM compose_rounds").fetchone()
    assert json.loads(stats)["version_torch"] == funnel["versions"]["torch"]
    # the CLI: the same line, no publish error; the call cap stops the build before its rounds run out
    out = tmp_path / "cli"
    assert main(_build_argv(out, server.base_url, f"no-code/{next(_ids)}", "--max-llm-calls", "4")) == 3
    err = capsys.readouterr().err
    (line,) = _error_lines(err)
    assert "--max-llm-calls 4 spent" in line and "round 0 unfinished (asked 4, answered 4, parsed 0" in line
    assert "rejected llm_no_code 4" in line and "0 rows kept" in line
    assert "Keys mismatch" not in err and _funnel(out)["stopped"] == "call_cap"


@pytest.mark.timeout(400)  # the first build of the module crawls torch (tens of seconds on a busy box)
def test_slow_answers_time_out_without_a_retry_storm_and_stop_the_build(server, tmp_path, capsys):
    from cudagym.cli import main

    out, model = tmp_path / "build", f"slow-always/{next(_ids)}"  # 1 s per answer, 0.3 s timeout
    argv = _build_argv(out, server.base_url, model, "--llm-timeout", "0.3", "--max-retries", "4",
                       "--llm-max-failures", "3", "--concurrency", "1")
    assert main(argv) == 3
    (line,) = _error_lines(capsys.readouterr().err)
    assert "stopped answering" in line and "Request timed out" in line
    assert server.fake.count(model) == 3  # one attempt per request, however many retries are allowed
    assert _funnel(out)["stopped"] == "endpoint_down"


@pytest.mark.slow
@pytest.mark.timeout(400)  # the first build of the module crawls torch (tens of seconds on a busy box)
def test_ctrl_c_stops_within_seconds_and_loses_no_answer(server, tmp_path, kernelbench_path):
    """A real SIGINT to `cudagym dataset build --composer llm` while answers are in flight."""
    import os
    import signal
    import subprocess
    import sys

    from cudagym.cli import main

    out, model = tmp_path / "build", f"slowfixed/{next(_ids)}"  # 1 s per answer
    argv = _build_argv(out, server.base_url, model, "--concurrency", "2", "--target", "20")
    env = {**os.environ, "CUDAGYM_KERNELBENCH": str(kernelbench_path)}
    proc = subprocess.Popen([sys.executable, "-m", "cudagym.cli", *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # a background shell ignores it
    try:
        deadline = time.monotonic() + 240
        while len(server.fake.answered[model]) < 3 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        answered = set(server.fake.answered[model])
        assert len(answered) >= 3 and proc.poll() is None
        time.sleep(3.0)  # answers sent by now have reached the client (and its cache), even on a loaded machine
        proc.send_signal(signal.SIGINT)
        sent = time.monotonic()
        _, err = proc.communicate(timeout=60)
        acted_in = time.monotonic() - sent
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert "Traceback" not in err and _error_lines(err)[-1].startswith("cudagym: interrupted (Ctrl-C)")
    assert acted_in < 30  # generous for a loaded machine; it waited out 120 s timeouts before
    funnel = _funnel(out)
    assert funnel["status"] == "stopped" and funnel["stopped"] == "interrupted"
    assert answered <= _cached_prompts(out)  # nothing answered is lost
    # the rerun asks none of them again
    before, cached = server.fake.count(model), _cached_prompts(out)
    assert main(_build_argv(out, server.base_url, model, "--concurrency", "2", "--target", "20",
                            "--max-llm-calls", "1")) == 3
    asked_again = [body["messages"][-1]["content"] for body in server.fake.requests[model][before:]]
    assert len(asked_again) == 1 and not set(asked_again) & cached


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_the_prefect_flow_writes_the_funnel_and_does_not_retry_a_stopped_compose(server, tmp_path, capsys,
                                                                                    prefect_harness):
    """The flow's compose task retries flaky failures, but not a stop: a retry would spend the call
    cap again or wait out a dead endpoint twice more."""
    from cudagym.cli import main

    out, model = tmp_path / "build", f"good/{next(_ids)}"
    wrong = server.base_url.removesuffix("/v1") + "/wrong/v1"  # 404 on /models: one one-token probe per check
    before = server.fake.not_found
    assert main(_build_argv(out, wrong, model, "--prefect")) == 3
    (line,) = _error_lines(capsys.readouterr().err)
    assert "HTTP 404" in line
    assert server.fake.not_found - before == 2  # GET /models and the probe, once: the task was not retried
    funnel = _funnel(out)
    assert funnel["stopped"] == "endpoint_unreachable" and funnel["status"] == "stopped"
