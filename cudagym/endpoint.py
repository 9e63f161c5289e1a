"""OpenAI-compatible endpoints: what every caller of one needs (the LLM composer, the agent client).

- `PLACEHOLDER_API_KEY`: the key sent when none is configured; local servers (vLLM, SGLang,
  llama.cpp) accept any key, and the `openai` client refuses to start without one.
- `retry_after_s`: the wait a 429 / 503 asks for (`retry-after-ms`, `retry-after` in seconds or as
  an HTTP date).
- `classify_api_error`: one failed request of the `openai` client as (reason, retry?, Retry-After):
  timeouts, connection errors, 429, 5xx, 408 and 409 are worth retrying; other statuses and
  malformed answers are not.
"""

from __future__ import annotations

import email.utils
import time
from dataclasses import dataclass
from typing import Mapping

PLACEHOLDER_API_KEY = "EMPTY"  # what local OpenAI-compatible servers (vLLM, llama.cpp) accept


def retry_after_s(headers: Mapping[str, str] | None) -> float | None:
    """Seconds a 429/503 asks us to wait (`retry-after-ms`, `retry-after` seconds or HTTP date)."""
    if not headers:
        return None
    try:
        if headers.get("retry-after-ms"):
            return max(0.0, float(headers["retry-after-ms"]) / 1000)
    except ValueError:
        pass
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        return max(0.0, email.utils.parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError):
        return None


@dataclass(frozen=True)
class APIFailure:
    """One failed request: `reason` is llm_timeout, llm_rate_limited or llm_error (stable names)."""

    reason: str
    detail: str  # exception type and first line, at most 200 characters
    retry: bool  # whether another attempt may succeed
    retry_after_s: float | None = None  # what the server asked for, if it did


def classify_api_error(e: Exception) -> APIFailure:
    """The APIFailure of an exception raised by the `openai` client (sync or async)."""
    import openai

    detail = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:200]
    if isinstance(e, openai.APITimeoutError):  # before APIConnectionError, its base
        return APIFailure("llm_timeout", detail, True)
    if isinstance(e, openai.APIConnectionError):
        return APIFailure("llm_error", detail, True)
    if isinstance(e, openai.APIStatusError):
        hinted = retry_after_s(e.response.headers)
        if isinstance(e, openai.RateLimitError):
            return APIFailure("llm_rate_limited", detail, True, hinted)
        retry = isinstance(e, openai.InternalServerError) or e.status_code in (408, 409)
        return APIFailure("llm_error", detail, retry, hinted)
    return APIFailure("llm_error", detail, False)  # bad JSON, validation: retrying will not help
