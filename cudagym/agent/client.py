"""The agent's model: chat completions through the real `openai.AsyncOpenAI` client.

Any OpenAI-compatible endpoint works (vLLM, SGLang, llama.cpp's server, a hosted API). `ClientConfig`
names the model, base URL and key (flag, else `OPENAI_API_KEY`, else a placeholder that local servers
accept). One `ChatClient` serves every rollout of a batch: a semaphore bounds the requests in flight
(`concurrency`), and each request gets our own retries (the openai client's are off): timeouts,
connection errors, 429 and 5xx are retried with exponential backoff and jitter, a server's
Retry-After is honoured up to `max_backoff_s` (`cudagym.endpoint` classifies the errors, as for the
LLM composer). A request that still fails returns a `ClientError` with a stable reason; it never raises.

Token counts come from the server's `usage`. A server that sends none gets an estimate instead,
tokenizer-free (`estimate_tokens`: one token per 4 characters of the JSON of the messages, the tool
schemas and the answer, plus 4 per message), marked `usage_source="estimate"` in the store.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import random
import re
import time
from dataclasses import dataclass, field

from cudagym.endpoint import PLACEHOLDER_API_KEY, classify_api_error

CHARS_PER_TOKEN = 4.0  # the estimate's ratio: English and code average 3.5-4.5 characters a token
TOKENS_PER_MESSAGE = 4  # role and separators a chat template adds per message


def estimate_tokens(messages: list[dict] | None = None, tools: list[dict] | None = None, text: str = "") -> int:
    """Tokenizer-free token estimate of messages (+ tool schemas) or of a plain text (module docstring)."""
    chars = len(text)
    n_messages = 0
    for message in messages or ():
        n_messages += 1
        chars += len(message.get("content") or "")
        if message.get("tool_calls"):
            chars += len(json.dumps(message["tool_calls"]))
    if tools:
        chars += len(json.dumps(tools))
    return math.ceil(chars / CHARS_PER_TOKEN) + TOKENS_PER_MESSAGE * n_messages


@dataclass(frozen=True)
class ClientConfig:
    """Where the model is and how to ask it. api_key None: $OPENAI_API_KEY, else a placeholder."""

    model: str
    base_url: str
    api_key: str | None = field(default=None, repr=False)
    timeout_s: float = 600.0  # per attempt (a long answer of a big model on a busy server takes minutes)
    max_retries: int = 4  # retries after the first attempt
    backoff_s: float = 1.0  # first retry waits ~backoff_s, doubling per retry, with jitter
    max_backoff_s: float = 60.0  # cap on one wait, Retry-After included
    concurrency: int = 16  # requests in flight at once over all rollouts

    def __post_init__(self):
        if not self.model:
            raise ValueError("no model: pass --model")
        if not re.match(r"https?://", self.base_url or ""):
            raise ValueError(f"base URL must start with http:// or https://, got {self.base_url!r}")
        if self.timeout_s <= 0:
            raise ValueError(f"client timeout must be > 0, got {self.timeout_s}")
        if self.max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {self.max_retries}")
        if self.backoff_s < 0 or self.max_backoff_s < self.backoff_s:
            raise ValueError(f"need 0 <= backoff_s <= max_backoff_s, got {self.backoff_s}, {self.max_backoff_s}")
        if self.concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {self.concurrency}")

    @property
    def key(self) -> str:
        return self.api_key or os.environ.get("OPENAI_API_KEY", "").strip() or PLACEHOLDER_API_KEY


@dataclass(frozen=True)
class Sampling:
    """Per-turn sampling settings, sent with every request (None: the server's default)."""

    temperature: float | None = 0.7
    top_p: float | None = None
    max_tokens: int | None = 4096

    def __post_init__(self):
        if self.temperature is not None and not 0 <= self.temperature <= 2:
            raise ValueError(f"temperature must be in [0, 2], got {self.temperature}")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")

    def to_dict(self) -> dict:
        return {"temperature": self.temperature, "top_p": self.top_p, "max_tokens": self.max_tokens}


@dataclass
class Reply:
    """One answer: the assistant message as the API returns it (role, content, tool_calls)."""

    message: dict
    finish_reason: str | None
    prompt_tokens: int
    completion_tokens: int
    usage_source: str  # "server" | "estimate"
    latency_s: float  # from the first attempt to the answer, waits included
    attempts: int


@dataclass
class ClientError:
    """A request that failed after every retry (or could not be retried)."""

    reason: str  # llm_timeout | llm_rate_limited | llm_error
    detail: str
    attempts: int
    latency_s: float


class ChatClient:
    """chat.completions with retries and bounded concurrency; `stats` counts requests, retries, errors."""

    def __init__(self, config: ClientConfig, sleep=asyncio.sleep):
        import openai

        self.config = config
        self._client = openai.AsyncOpenAI(api_key=config.key, base_url=config.base_url, timeout=config.timeout_s,
                                          max_retries=0)
        self._sleep = sleep
        self._jitter = random.Random()
        self._semaphore: asyncio.Semaphore | None = None  # made in the running event loop
        self.stats: dict[str, int] = {}

    def _count(self, key: str, n: int = 1) -> None:
        self.stats[key] = self.stats.get(key, 0) + n

    async def chat(self, messages: list[dict], tools: list[dict] | None, sampling: Sampling) -> Reply | ClientError:
        """The model's next message for `messages` (tools offered natively when given)."""
        import openai

        if self._semaphore is None:
            self._semaphore = asyncio.Semaphore(self.config.concurrency)
        cfg = self.config
        kwargs = {k: v for k, v in sampling.to_dict().items() if v is not None}
        if tools:
            kwargs.update(tools=tools, tool_choice="auto")  # llama.cpp's function-calling format needs "auto"
        start = time.monotonic()
        failure, wait = None, 0.0
        for attempt in range(cfg.max_retries + 1):
            if attempt:
                self._count("retries")
                await self._sleep(wait)
            self._count("requests")
            try:
                async with self._semaphore:
                    response = await self._client.chat.completions.create(model=cfg.model, messages=messages, **kwargs)
            except openai.OpenAIError as e:
                failure = classify_api_error(e)
                self._count(f"errors_{failure.reason}")
                if not failure.retry:
                    return ClientError(failure.reason, f"attempt {attempt + 1}: {failure.detail}", attempt + 1,
                                       time.monotonic() - start)
                backoff = min(cfg.max_backoff_s, cfg.backoff_s * 2 ** attempt)
                wait = (min(cfg.max_backoff_s, failure.retry_after_s) if failure.retry_after_s is not None
                        else backoff / 2 + self._jitter.uniform(0, backoff / 2))
                continue
            if not response.choices:
                self._count("errors_llm_error")
                return ClientError("llm_error", "answer without choices", attempt + 1, time.monotonic() - start)
            return self._reply(response, messages, tools, attempt + 1, time.monotonic() - start)
        return ClientError(failure.reason, f"{cfg.max_retries + 1} attempts: {failure.detail}", cfg.max_retries + 1,
                           time.monotonic() - start)

    def _reply(self, response, messages: list[dict], tools: list[dict] | None, attempts: int, latency_s: float) -> Reply:
        choice = response.choices[0]
        message = {"role": "assistant", "content": choice.message.content or ""}
        calls = [{"id": c.id or f"call_{i}", "type": "function",
                  "function": {"name": c.function.name or "", "arguments": c.function.arguments or ""}}
                 for i, c in enumerate(choice.message.tool_calls or ()) if getattr(c, "function", None)]
        if calls:
            message["tool_calls"] = calls
        usage = response.usage
        prompt, completion = getattr(usage, "prompt_tokens", None), getattr(usage, "completion_tokens", None)
        if prompt is not None and completion is not None:
            source = "server"
        else:
            prompt, completion, source = estimate_tokens(messages, tools), estimate_tokens([message]), "estimate"
        self._count("prompt_tokens", prompt)
        self._count("completion_tokens", completion)
        return Reply(message, choice.finish_reason, int(prompt), int(completion), source, latency_s, attempts)

    async def close(self) -> None:
        await self._client.close()
