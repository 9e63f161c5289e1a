"""The `llm` composer: an LLM fuses K seed operators into one KernelBench-format task.

Any OpenAI-compatible chat endpoint works (OpenAI, vLLM, llama.cpp's server, ...): `LLMConfig` names
the model, base URL and key (from arguments, else `CUDAGYM_LLM_MODEL`, `CUDAGYM_LLM_BASE_URL` /
`OPENAI_BASE_URL`, `CUDAGYM_LLM_API_KEY` / `OPENAI_API_KEY`; a local server needs no key).

One composition is: pick K seeds (the programmatic composer's family weighting), ask for one fused
module (`build_prompt`), call the endpoint (`LLMClient.complete`: our own retries with exponential
backoff and jitter on 429 / connection errors / 5xx, Retry-After honoured up to `max_backoff_s`; a
timeout is not retried, the server may still be working on it; a DuckDB cache of answers keyed by
the prompt, so a rerun makes no HTTP call), then parse the answer (`parse_answer`: fenced, tagged
or bare code, see `extract_code`). Every failure is a `compose.Reject` with a stable code
(`REJECT_REASONS`), never an exception. `compose_batch` runs up to `concurrency` compositions at
once, in daemon threads (Ctrl-C acts at once); results keep the order of the requests.

What stops a build (`LLMComposer.stopped`, raised by the compose step as `compose.ComposeStopped`
after the batch): the health check before the first uncached request (`LLMClient.check_endpoint`),
the circuit breaker (`max_failures` attempts in a row without an HTTP answer), the call cap
(`max_calls`) and Ctrl-C. Answers already received are in the cache by then.

The dataset's labels (`ops`, `data_source`) come from the code's AST (`labels.ops_from_code`,
`labels.data_source_of`), never from what the model says it wrote. The answer's code is not run
here: the exec filter, a later step, runs every task in a sandbox.
"""

from __future__ import annotations

import ast
import hashlib
import html
import json
import logging
import os
import random
import re
import threading
import time
from collections import Counter
import queue
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

import libcst as cst
from libcst.helpers import get_full_name_for_node

from cudagym.endpoint import PLACEHOLDER_API_KEY, classify_api_error, retry_after_s  # noqa: F401 - re-exported
from cudagym.synth.compose import ComposeConfig, ProgrammaticComposer, Reject, register_composer
from cudagym.synth.labels import data_source_of, ops_from_code
from cudagym.synth.render import seed_snippet
from cudagym.synth.seeds import Seed
from cudagym.tasks import Task, sha256_text

log = logging.getLogger(__name__)

ALLOWED_IMPORTS = frozenset({"torch", "torch.nn", "torch.nn.functional", "torch.fft", "torch.linalg",
                             "torch.special", "math"})
MODEL_BASES = frozenset({"nn.Module", "torch.nn.Module", "Module"})
FORBIDDEN_CALLS = frozenset({"__import__", "exec", "eval", "compile", "open"})
PYTHON_FENCE_TAGS = frozenset({"", "python", "py", "python3"})

REJECT_REASONS: Mapping[str, str] = {
    "no_seeds": "no verified seeds to compose",
    "llm_error": "the endpoint failed (connection, 5xx, other status) after all retries, or gave no choice",
    "llm_timeout": "the request timed out (not retried: the server is slower than the timeout; raise --llm-timeout)",
    "llm_endpoint_down": "not sent: the endpoint failed its health check or stopped answering (circuit breaker)",
    "llm_call_cap": "not sent: --max-llm-calls were spent",
    "llm_stopped": "not sent: the build was interrupted",
    "llm_rate_limited": "the last attempt was rate limited (429), after all retries",
    "llm_truncated": "the answer stopped at max_tokens (finish_reason 'length')",
    "llm_no_code": "no python code in the answer (fenced, in <code> tags, or bare)",
    "llm_ambiguous": "several code blocks and none defines class Model",
    "llm_syntax": "the code block does not parse",
    "llm_bad_import": "an import other than torch/torch.nn/F/math (or a seed's own), or __import__/exec/eval/open",
    "llm_model_new": "the code defines ModelNew (a solution, not a task)",
    "llm_missing_model": "no top-level `class Model(nn.Module)` with a forward",
    "llm_missing_inputs": "no top-level get_inputs() or get_init_inputs()",
    "llm_label_empty": "ops_from_code finds no operator in forward",
}

SYSTEM_PROMPT = ("You write PyTorch reference programs in the KernelBench format for a GPU-kernel benchmark. "
                 "You answer with code only.")

PROMPT_TEMPLATE = """\
Write one PyTorch program that fuses these {k} operator(s) into a single model. Apply them in a \
sensible order in which each operator's output feeds the next:

{operators}

Rules:
1. Define `class Model(nn.Module)` with `__init__` (build every module and parameter there) and \
`forward` (apply each of the operators above exactly once).
2. Define `get_inputs()`, returning the list of input tensors of `forward`, and `get_init_inputs()`, \
returning the list of arguments of `Model.__init__`. Put sizes in module-level constants; keep every \
tensor under a million elements.
3. Make the shapes fit: between operators insert only views (`view`, `reshape`, `flatten`, \
`unsqueeze`); add no other operators.
4. Import only `torch`, `torch.nn as nn`, `torch.nn.functional as F` and `math`{extra_imports}. \
No randomness in `forward`, no printing, no file or network access, no other classes, no `ModelNew`.
5. Reply with exactly one ```python code block holding the whole program, and nothing else.

The format, shown for other operators (do not copy them):
```python
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        x = self.linear(x)
        return torch.sigmoid(x)


batch_size = 16
in_features = 64
out_features = 32


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features]
```
"""

# --------------------------------------------------------------------------------------------
# Config
# --------------------------------------------------------------------------------------------


def _env(*names: str) -> str:
    return next((os.environ[n].strip() for n in names if os.environ.get(n, "").strip()), "")


@dataclass(frozen=True)
class LLMConfig:
    """Settings of the llm composer. model / base_url / api_key default to the environment."""

    model: str = field(default_factory=lambda: _env("CUDAGYM_LLM_MODEL"))
    base_url: str = field(default_factory=lambda: _env("CUDAGYM_LLM_BASE_URL", "OPENAI_BASE_URL"))
    api_key: str = field(default_factory=lambda: _env("CUDAGYM_LLM_API_KEY", "OPENAI_API_KEY") or PLACEHOLDER_API_KEY,
                         repr=False)
    # Requests in flight at once. 1 suits a local server that answers one request at a time (llama.cpp's
    # default): more would only queue there and time out; hosted APIs and vLLM take 8 or more.
    concurrency: int = 1
    max_retries: int = 4  # retries after the first attempt (the openai client's own retries are off)
    timeout_s: float = 300.0  # per attempt; a timed-out request is not retried (a slow server would get it twice)
    temperature: float = 0.7
    max_tokens: int = 2048
    cache_path: str | None = None  # DuckDB file of answers; None: no cache
    backoff_s: float = 1.0  # first retry waits ~backoff_s, doubling per retry (with jitter)
    max_backoff_s: float = 60.0  # cap on one wait, Retry-After included
    max_calls: int | None = None  # HTTP requests this process may make (None: no cap); cached answers are free
    max_failures: int = 6  # attempts in a row without an HTTP answer (refused, reset, timed out) that stop the build
    health_check: bool = True  # GET /models (else a 1-token request) before the first uncached request

    def __post_init__(self):
        if not self.model:
            raise ValueError("no LLM model: pass --model or set CUDAGYM_LLM_MODEL")
        if not self.base_url:
            raise ValueError("no LLM endpoint: pass --base-url or set CUDAGYM_LLM_BASE_URL (or OPENAI_BASE_URL)")
        if not re.match(r"https?://", self.base_url):
            raise ValueError(f"LLM base URL must start with http:// or https://: {self.base_url!r}")
        if self.concurrency < 1:
            raise ValueError(f"LLM concurrency must be >= 1, got {self.concurrency}")
        if self.max_retries < 0:
            raise ValueError(f"LLM max_retries must be >= 0, got {self.max_retries}")
        if self.timeout_s <= 0:
            raise ValueError(f"LLM timeout_s must be > 0, got {self.timeout_s}")
        if not 0 <= self.temperature <= 2:
            raise ValueError(f"LLM temperature must be in [0, 2], got {self.temperature}")
        if self.max_tokens < 1:
            raise ValueError(f"LLM max_tokens must be >= 1, got {self.max_tokens}")
        if self.max_calls is not None and self.max_calls < 1:
            raise ValueError(f"--max-llm-calls must be >= 1, got {self.max_calls}")
        if self.max_failures < 1:
            raise ValueError(f"LLM max_failures must be >= 1, got {self.max_failures}")
        if self.backoff_s < 0 or self.max_backoff_s < self.backoff_s:
            raise ValueError(f"LLM backoff: need 0 <= backoff_s <= max_backoff_s, got {self.backoff_s}, "
                             f"{self.max_backoff_s}")


# --------------------------------------------------------------------------------------------
# Prompt
# --------------------------------------------------------------------------------------------


def seed_import_modules(seeds: Sequence[Seed]) -> frozenset[str]:
    """Modules the seeds' own import lines name (transformers blocks need theirs)."""
    modules: set[str] = set()
    for seed in seeds:
        for line in seed.imports:
            for node in ast.walk(ast.parse(line)):
                if isinstance(node, ast.ImportFrom) and node.module:
                    modules.add(node.module)
                elif isinstance(node, ast.Import):
                    modules.update(a.name for a in node.names)
    return frozenset(modules)


def build_prompt(seeds: Sequence[Seed]) -> str:
    """The user message asking for one module that fuses `seeds` (listed with a scale-1 snippet each)."""
    operators = "\n".join(f"{i}. `{s.qualified_name}` ({s.name or s.qualified_name.rsplit('.', 1)[-1]}), "
                          f"e.g. `{seed_snippet(s)}`" for i, s in enumerate(seeds, 1))
    seed_imports = [line for s in seeds for line in s.imports]
    extra = ", plus: " + "; ".join(f"`{line}`" for line in dict.fromkeys(seed_imports)) if seed_imports else ""
    return PROMPT_TEMPLATE.format(k=len(seeds), operators=operators, extra_imports=extra)


# --------------------------------------------------------------------------------------------
# Strict parsing
# --------------------------------------------------------------------------------------------

_FENCE = re.compile(r"^[ \t]*```[ \t]*([\w+-]*)[^\n]*\n(.*?)^[ \t]*```[ \t]*$", re.MULTILINE | re.DOTALL)
_CODE_TAG = re.compile(r"<code(?:\s+class=[\"']?(?:language-)?([\w+-]*)[\"']?)?\s*>(.*?)</code>", re.DOTALL | re.IGNORECASE)
_THINKING = re.compile(r"<think>.*?(?:</think>|$)", re.DOTALL | re.IGNORECASE)
_DEFINES_MODEL = re.compile(r"^class\s+Model\b", re.MULTILINE)
_CODE_START = re.compile(r"^(?:import |from \w[\w.]* import |class Model\b)")
MAX_TRAILING_PROSE = 40  # lines of prose after bare code that extract_code trims off


def _bare_code(text: str) -> str | None:
    """Code with no fence or tag: from the first import (or `class Model`) line to the longest end
    that parses, trailing prose trimmed; None if no such span defines class Model."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if _CODE_START.match(line)), None)
    if start is None:
        return None
    for end in range(len(lines), max(start, len(lines) - MAX_TRAILING_PROSE), -1):
        code = "\n".join(lines[start:end])
        if not _DEFINES_MODEL.search(code):
            return None
        try:
            ast.parse(code)
        except SyntaxError:
            continue
        return code
    return None


def extract_code(text: str) -> str | Reject:
    """The program in an answer, as chat models write it.

    Python blocks are fenced (```python, ```py, or ``` with no tag) or in <code> tags (HTML-style
    answers); blocks tagged with another language (```bash) are ignored. One block: that one.
    Several: the last one that defines `class Model` (a usage example or a shell line is not the
    program; a model that corrects itself puts the final version last); several and none defines
    Model: `llm_ambiguous`. No block: bare code (from its first import line, prose before and after
    trimmed), else `llm_no_code` (an unclosed fence too: the answer was cut off).
    """
    text = _THINKING.sub("", text)  # a reasoning model's drafts are not its answer
    blocks = [body for tag, body in _FENCE.findall(text) if tag.lower() in PYTHON_FENCE_TAGS]
    blocks += [html.unescape(body) for tag, body in _CODE_TAG.findall(text) if (tag or "").lower() in PYTHON_FENCE_TAGS]
    blocks = [b for b in blocks if b.strip()]
    if len(blocks) > 1:
        models = [b for b in blocks if _DEFINES_MODEL.search(b)]
        if not models:
            return Reject("llm_ambiguous", f"{len(blocks)} code blocks, none defines class Model")
        blocks = models[-1:]
    if blocks:
        return blocks[0].strip("\n") + "\n"
    if "```" in text:
        return Reject("llm_no_code", "unclosed or empty code fence")
    bare = _bare_code(text)
    if bare is None:
        return Reject("llm_no_code", "no code block")
    return bare.strip("\n") + "\n"


class _ImportCheck(cst.CSTVisitor):
    """Every import (at any depth) must name an allowed module; no dynamic import/exec."""

    def __init__(self, allowed: frozenset[str]):
        self.allowed = allowed
        self.bad: list[str] = []

    def visit_Import(self, node: cst.Import) -> None:
        for alias in node.names:
            name = get_full_name_for_node(alias.name) or ""
            if name not in self.allowed:
                self.bad.append(f"import {name}")

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        module = get_full_name_for_node(node.module) if node.module is not None else ""
        if node.relative or module not in self.allowed:
            self.bad.append(f"from {'.' * len(node.relative)}{module} import ...")

    def visit_Call(self, node: cst.Call) -> None:
        if isinstance(node.func, cst.Name) and node.func.value in FORBIDDEN_CALLS:
            self.bad.append(f"{node.func.value}()")


def check_code(code: str, allowed_imports: frozenset[str] = ALLOWED_IMPORTS) -> Reject | None:
    """None if `code` is a well-formed KernelBench task; else the Reject saying why (libcst parse)."""
    try:
        module = cst.parse_module(code)
    except cst.ParserSyntaxError as e:
        return Reject("llm_syntax", f"line {e.raw_line}: {e.message}"[:200])
    imports = _ImportCheck(allowed_imports)
    module.visit(imports)
    if imports.bad:
        return Reject("llm_bad_import", ", ".join(dict.fromkeys(imports.bad))[:200])
    if any(isinstance(node, cst.ClassDef) and node.name.value == "ModelNew" for node in _walk(module)):
        return Reject("llm_model_new", "defines class ModelNew")
    classes = {n.name.value: n for n in module.body if isinstance(n, cst.ClassDef)}
    functions = {n.name.value for n in module.body if isinstance(n, cst.FunctionDef)}
    model = classes.get("Model")
    if model is None:
        return Reject("llm_missing_model", "no top-level class Model")
    bases = {cst.Module(body=[]).code_for_node(b.value) for b in model.bases}
    if not bases & MODEL_BASES:
        return Reject("llm_missing_model", f"Model bases {sorted(bases)}, not nn.Module")
    if not any(isinstance(n, cst.FunctionDef) and n.name.value == "forward" for n in model.body.body):
        return Reject("llm_missing_model", "Model has no forward")
    missing = [name for name in ("get_inputs", "get_init_inputs") if name not in functions]
    if missing:
        return Reject("llm_missing_inputs", f"no top-level {', '.join(missing)}")
    try:
        ast.parse(code)  # what the labeller uses; libcst accepts some syntax this Python does not
    except SyntaxError as e:
        return Reject("llm_syntax", f"line {e.lineno}: {e.msg}")
    return None


def _walk(node: cst.CSTNode):
    yield node
    for child in node.children:
        yield from _walk(child)


def parse_answer(text: str, allowed_imports: frozenset[str] = ALLOWED_IMPORTS) -> str | Reject:
    """The task code of an answer, or the Reject of a malformed one (see REJECT_REASONS)."""
    code = extract_code(text)
    if isinstance(code, Reject):
        return code
    return check_code(code, allowed_imports) or code


# --------------------------------------------------------------------------------------------
# Cache
# --------------------------------------------------------------------------------------------


def cache_key(model: str, messages: Sequence[Mapping[str, str]], temperature: float, max_tokens: int) -> str:
    payload = json.dumps([model, list(messages), temperature, max_tokens], sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()


@dataclass(frozen=True)
class Answer:
    """One reply of the endpoint (fresh or cached)."""

    text: str
    usage: dict  # prompt_tokens, completion_tokens, total_tokens
    finish_reason: str | None = None
    cached: bool = False
    attempts: int = 0  # HTTP requests this answer took (0 when cached)


class ResponseCache:
    """Answers in one DuckDB file, keyed by `cache_key`. One process per file (DuckDB's lock);
    threads share the connection under a lock. Only answers are stored, never API errors."""

    _SCHEMA = """CREATE TABLE IF NOT EXISTS llm_responses (
        key VARCHAR PRIMARY KEY, model VARCHAR, prompt VARCHAR, response VARCHAR, finish_reason VARCHAR,
        prompt_tokens BIGINT, completion_tokens BIGINT, total_tokens BIGINT, created TIMESTAMP)"""

    def __init__(self, path: str | Path):
        import duckdb

        from cudagym.tasks.db import connect, error_of

        self.path = Path(path)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ValueError(f"cannot open LLM cache {self.path}: {str(e).splitlines()[0]}") from None
        self._con = connect(self.path, "LLM cache", option="--llm-cache")
        try:
            self._con.execute(self._SCHEMA)
        except duckdb.Error as e:
            self._con.close()
            raise error_of(e, self.path, "LLM cache", "--llm-cache") from None
        self._lock = threading.Lock()
        self._closed = False

    def get(self, key: str) -> Answer | None:
        with self._lock:
            if self._closed:
                return None
            row = self._con.execute("SELECT response, finish_reason, prompt_tokens, completion_tokens, total_tokens"
                                    " FROM llm_responses WHERE key = ?", [key]).fetchone()
        if row is None:
            return None
        usage = dict(zip(("prompt_tokens", "completion_tokens", "total_tokens"), row[2:]))
        return Answer(text=row[0], usage=usage, finish_reason=row[1], cached=True)

    def put(self, key: str, model: str, prompt: str, answer: Answer) -> None:
        u = answer.usage
        with self._lock:
            if self._closed:  # an answer that came after Ctrl-C closed the cache
                return
            self._con.execute("INSERT OR REPLACE INTO llm_responses VALUES (?, ?, ?, ?, ?, ?, ?, ?, current_timestamp)",
                              [key, model, prompt, answer.text, answer.finish_reason, u["prompt_tokens"],
                               u["completion_tokens"], u["total_tokens"]])

    def __len__(self) -> int:
        with self._lock:
            return self._con.execute("SELECT count(*) FROM llm_responses").fetchone()[0]

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._con.close()


# --------------------------------------------------------------------------------------------
# Client
# --------------------------------------------------------------------------------------------


class LLMClient:
    """chat.completions through the real `openai.OpenAI` client, with our retries and cache.

    `stats` (a Counter, updated under a lock) counts `requests` (HTTP calls), `retries`,
    `cache_hits`, `cache_misses`, `errors_<reason>` per failed attempt, and the tokens of fresh
    answers (`prompt_tokens`, `completion_tokens`, `total_tokens`; cached answers cost nothing).
    """

    def __init__(self, config: LLMConfig, sleep=time.sleep):
        import openai

        self.config = config
        self._openai = openai
        self._client = openai.OpenAI(api_key=config.api_key, base_url=config.base_url, timeout=config.timeout_s,
                                     max_retries=0)
        self.cache = ResponseCache(config.cache_path) if config.cache_path else None
        self.stats: Counter = Counter()
        self._lock = threading.Lock()
        self._sleep = sleep
        self._jitter = random.Random()  # not the step's rng: waits never change what is built
        self.stop = threading.Event()  # set on Ctrl-C: no new attempt starts, backoff waits end
        self.stopped: tuple[str, str] | None = None  # (ComposeStopped reason, one-line message) once the build must stop
        self._failures = 0  # attempts in a row that got no HTTP answer
        self._checked = not config.health_check
        self._check_lock = threading.Lock()

    def _stop(self, reason: str, message: str) -> None:
        with self._lock:
            if self.stopped is None:
                self.stopped = (reason, message)

    def interrupt(self) -> None:
        self._stop("interrupted", "interrupted (Ctrl-C): every answer received so far is in the LLM cache")
        self.stop.set()

    def _wait(self, seconds: float) -> None:
        if self._sleep is time.sleep:
            self.stop.wait(seconds)
        else:  # tests pass their own clock
            self._sleep(seconds)

    def check_endpoint(self) -> None:
        """Fail fast (sets `stopped`) when the endpoint cannot serve chat completions: GET /models, and
        on a 404 there (some servers do not list models) one chat request of one token."""
        oa, url = self._openai, self.config.base_url
        quick = self._client.with_options(timeout=min(self.config.timeout_s, 30.0), max_retries=0)
        self._count(health_checks=1)
        try:
            try:
                quick.models.list()
            except oa.NotFoundError:
                quick.chat.completions.create(model=self.config.model, max_tokens=1,
                                              messages=[{"role": "user", "content": "Say OK."}])
        except (oa.AuthenticationError, oa.PermissionDeniedError) as e:
            self._stop("endpoint_unreachable", f"LLM endpoint {url} refused the API key (HTTP {e.status_code}): "
                                               "set CUDAGYM_LLM_API_KEY (or OPENAI_API_KEY) or --api-key")
        except oa.NotFoundError:
            self._stop("endpoint_unreachable", f"no OpenAI-compatible API at {url} (HTTP 404 on /models and on "
                                               f"/chat/completions for model {self.config.model!r}): check --base-url "
                                               "(it usually ends in /v1) and --model")
        except oa.APIStatusError as e:
            if e.status_code >= 500 or e.status_code == 429:
                return  # a busy or flaky server: the requests' own retries and the breaker handle it
            self._stop("endpoint_unreachable", f"LLM endpoint {url} answered the health check with HTTP "
                                               f"{e.status_code}: {str(e).splitlines()[0][:120]}")
        except oa.APIError as e:  # connection refused, DNS, timeout
            self._stop("endpoint_unreachable", f"LLM endpoint {url} does not answer ({type(e).__name__}: "
                                               f"{str(e).splitlines()[0][:80] if str(e) else 'no detail'}): start "
                                               "the server or fix --base-url")

    def _before_attempt(self) -> Reject | None:
        """The Reject that stops an attempt before it is sent (stopped, breaker, cap), else None (and
        the attempt is counted)."""
        if not self._checked:
            with self._check_lock:  # the other workers wait for the one check instead of hammering a dead URL
                if not self._checked:
                    self.check_endpoint()
                    self._checked = True
        if self.stop.is_set():
            return Reject("llm_stopped", "interrupted")
        if self.stopped is not None:
            return Reject("llm_endpoint_down" if self.stopped[0].startswith("endpoint") else
                          "llm_call_cap" if self.stopped[0] == "call_cap" else "llm_stopped", self.stopped[1][:200])
        with self._lock:
            cap = self.config.max_calls
            if cap is not None and self.stats["requests"] >= cap:
                spent = True
            else:
                spent = False
                self.stats["requests"] += 1
        if spent:
            self._stop("call_cap", f"--max-llm-calls {cap} spent: the build stops here; every answer is in the LLM "
                                   "cache, so a rerun with a larger cap asks only what is new")
            return Reject("llm_call_cap", f"{cap} calls spent")
        return None

    def _transport(self, ok: bool, detail: str = "") -> None:
        """Count an attempt that got an HTTP answer (ok) or none; open the breaker after max_failures."""
        with self._lock:
            self._failures = 0 if ok else self._failures + 1
            tripped = self._failures >= self.config.max_failures
        if tripped:
            self._stop("endpoint_down", f"LLM endpoint {self.config.base_url} stopped answering: "
                                        f"{self.config.max_failures} attempts in a row got no answer (last: {detail}); "
                                        "every answer received so far is in the LLM cache")

    def _count(self, **amounts: int) -> None:
        with self._lock:
            self.stats.update(amounts)

    def messages(self, prompt: str) -> list[dict[str, str]]:
        return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": prompt}]

    def complete(self, prompt: str) -> Answer | Reject:
        """The endpoint's answer to `prompt` (from the cache when there), or the Reject of an API failure."""
        cfg = self.config
        messages = self.messages(prompt)
        key = cache_key(cfg.model, messages, cfg.temperature, cfg.max_tokens)
        if self.cache is not None:
            hit = self.cache.get(key)
            if hit is not None:
                self._count(cache_hits=1)
                return hit
            self._count(cache_misses=1)
        reject, wait = Reject("llm_error", "no attempt"), 0.0
        for attempt in range(cfg.max_retries + 1):
            if attempt:
                self._count(retries=1)
                self._wait(wait)
            not_sent = self._before_attempt()
            if not_sent is not None:
                return not_sent
            try:
                response = self._client.chat.completions.create(
                    model=cfg.model, messages=messages, temperature=cfg.temperature, max_tokens=cfg.max_tokens)
            except self._openai.OpenAIError as e:
                reject, retry, hinted = self._classify(e)
                self._count(**{f"errors_{reject.reason}": 1})
                answered = isinstance(e, self._openai.APIStatusError)
                self._transport(answered, reject.detail)
                log.debug("llm attempt %d: %s %s", attempt + 1, reject.reason, reject.detail)
                if reject.reason == "llm_timeout":  # the server may still be working on it: asking again doubles its load
                    return Reject("llm_timeout", f"attempt {attempt + 1} after {cfg.timeout_s:g} s (raise --llm-timeout "
                                                 f"or lower --concurrency): {reject.detail}"[:300])
                if not retry:
                    return Reject(reject.reason, f"attempt {attempt + 1}: {reject.detail}")
                backoff = min(cfg.max_backoff_s, cfg.backoff_s * 2 ** attempt)
                wait = min(cfg.max_backoff_s, hinted) if hinted is not None else \
                    backoff / 2 + self._jitter.uniform(0, backoff / 2)
                continue
            self._transport(True)
            if not response.choices:
                self._count(errors_llm_error=1)
                return Reject("llm_error", "answer without choices")
            choice = response.choices[0]
            usage = response.usage
            counts = {"prompt_tokens": getattr(usage, "prompt_tokens", 0) or 0,
                      "completion_tokens": getattr(usage, "completion_tokens", 0) or 0,
                      "total_tokens": getattr(usage, "total_tokens", 0) or 0}
            self._count(**counts)
            answer = Answer(text=choice.message.content or "", usage=counts, finish_reason=choice.finish_reason,
                            attempts=attempt + 1)
            if self.cache is not None:
                self.cache.put(key, cfg.model, prompt, answer)
            return answer
        return Reject(reject.reason, f"{cfg.max_retries + 1} attempts: {reject.detail}")

    def _classify(self, e: Exception) -> tuple[Reject, bool, float | None]:
        """(reject, whether to retry, Retry-After seconds) for one failed attempt."""
        failure = classify_api_error(e)
        return Reject(failure.reason, failure.detail), failure.retry, failure.retry_after_s

    def close(self) -> None:
        self._client.close()
        if self.cache is not None:
            self.cache.close()


# --------------------------------------------------------------------------------------------
# Composer
# --------------------------------------------------------------------------------------------


@register_composer("llm")
class LLMComposer:
    """Seeds in, one LLM-written fused task out (or a Reject); see the module docstring."""

    name = "llm"

    def __init__(self, config: ComposeConfig | None = None, llm: LLMConfig | None = None):
        self.config = config or ComposeConfig()
        self.llm = llm or getattr(self.config, "llm", None) or LLMConfig()
        self.client = LLMClient(self.llm)
        self._picker = ProgrammaticComposer(self.config)  # for its family weighting

    @property
    def concurrency(self) -> int:
        return self.llm.concurrency

    @property
    def stats(self) -> Counter:
        return self.client.stats

    @property
    def max_calls(self) -> int | None:
        return self.llm.max_calls

    @property
    def stopped(self) -> tuple[str, str] | None:
        """(reason, message) once the build must stop (endpoint down, cap spent, Ctrl-C), else None."""
        return self.client.stopped

    def pick(self, seeds: Sequence[Seed], k: int, rng: random.Random) -> list[Seed]:
        """k distinct verified seeds, drawn with equal weight per family (as the programmatic composer)."""
        pool = [s for s in seeds if s.ops]
        if not pool:
            return []
        return self._picker._order(pool, self._picker._weights(pool), rng, k)

    def compose(self, seeds: Sequence[Seed], k: int, rng: random.Random) -> Task | Reject:
        return self.compose_batch([(self.pick(seeds, k, rng), k)])[0]

    def compose_batch(self, requests: Sequence[tuple[Sequence[Seed], int]]) -> list[Task | Reject]:
        """Compose each (chosen seeds, K) request, up to `concurrency` at once; results in request order."""
        results: list[Task | Reject | None] = [None] * len(requests)
        todo = queue.SimpleQueue()
        for i in range(len(requests)):
            todo.put(i)

        def work() -> None:
            while not self.client.stop.is_set():
                try:
                    i = todo.get_nowait()
                except queue.Empty:
                    return
                try:
                    results[i] = self._compose_chosen(*requests[i])
                except Exception as e:  # noqa: BLE001 - e.g. the client closed under it after Ctrl-C
                    results[i] = Reject("llm_stopped" if self.client.stop.is_set() else "llm_error",
                                        f"{type(e).__name__}: {e}"[:200])

        # Daemon threads, joined in short waits: Ctrl-C reaches this thread at once, and a request still
        # in flight then neither holds up the exit nor loses anything (its answer, if it comes before
        # the exit, goes to the cache).
        threads = [threading.Thread(target=work, name=f"llm-compose-{n}", daemon=True)
                   for n in range(min(self.concurrency, len(requests)))]
        try:
            for thread in threads:
                thread.start()
            for thread in threads:
                while thread.is_alive():
                    thread.join(0.2)
        except KeyboardInterrupt:
            self.client.interrupt()
            raise
        return [r if r is not None else Reject("llm_stopped", "interrupted") for r in results]

    def _compose_chosen(self, seeds: Sequence[Seed], k: int) -> Task | Reject:
        seeds = list(seeds)
        if not seeds:
            return Reject("no_seeds", "no verified seeds")
        if len(seeds) != k:
            return Reject("no_seeds", f"{len(seeds)} verified seeds for K={k}")
        prompt = build_prompt(seeds)
        answer = self.client.complete(prompt)
        if isinstance(answer, Reject):
            return answer
        if answer.finish_reason == "length":
            return Reject("llm_truncated", f"{answer.usage['completion_tokens']} completion tokens")
        code = parse_answer(answer.text, ALLOWED_IMPORTS | seed_import_modules(seeds))
        if isinstance(code, Reject):
            return code
        ops = ops_from_code(code)
        if not ops:
            return Reject("llm_label_empty", "no operator in Model.forward")
        seed_ops = [op for s in seeds for op in s.ops]
        missing = list((Counter(seed_ops) - Counter(ops)).elements())
        sha = sha256_text(code)
        provenance = {
            "composer": self.name, "model": self.llm.model, "k": k, "seed_ids": [s.id for s in seeds],
            "seed_ops": seed_ops, "seed_kinds": [s.kind for s in seeds], "ops": ops,
            "missing_seed_ops": missing, "data_source": data_source_of(code), "usage": dict(answer.usage),
            "cached": answer.cached, "attempts": answer.attempts, "prompt_sha256": sha256_text(prompt),
        }
        name = "_".join(s.name or s.qualified_name.rsplit(".", 1)[-1] for s in seeds)
        return Task(id=f"synth/{sha[:12]}", name=name, code=code, level=1 if k == 1 else 2,
                    source=f"synth:{self.name}", provenance=provenance)

    def close(self) -> None:
        self.client.close()

    def __enter__(self) -> "LLMComposer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
