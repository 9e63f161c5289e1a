"""The ReAct loop: query the model, parse its tool calls, execute them in the environment, observe.

The shape of mini-swe-agent's DefaultAgent: `run` repeats `step` (check limits, fit the context,
`query`, `parse`, `execute`, observe) until a terminating outcome; the recorder writes every
message, tool call and turn as it happens. Outcomes:

- recoverable: a tool call that cannot be run (unknown tool, arguments that are not a JSON object,
  a `<tool_call>` block that does not parse) gets an `error: ...` message back and the loop goes on;
  so does a tool that fails (the environment's ToolResult says so);
- terminating (`stop_reason`): `answer` (a reply without a tool call), `max_turns`, `context_budget`,
  `wall_time`, `invalid_calls` (`max_invalid_calls` invalid calls in a row), `client_error` (the
  endpoint failed after every retry).

Tool calls come natively (`tool_calls` in the reply) or written as text, Hermes / Qwen style:
`<tool_call>{"name": ..., "arguments": {...}}</tool_call>` in the content. `tool_format` picks:
`native` (tools sent as API tools; text ignored), `text` (no API tools: the schemas go into the
system prompt in a `<tools>` block and results come back as `<tool_response>` blocks in a user
message), `auto` (tools sent natively; a reply without `tool_calls` but with `<tool_call>` blocks is
taken as text calls, answered as in `text`).

Context budget (`context_tokens`): before each query the prompt's size is estimated
(`client.estimate_tokens`, scaled by the ratio of the server's last reported prompt_tokens to the
estimate of that prompt, when it reported one). While estimate + max_tokens exceeds the budget, the
oldest tool output not yet shortened is cut to its first `shortened_chars` characters plus a marker
saying how much was dropped; the newest `keep_recent_outputs` outputs are never cut. If everything
that may be cut is cut and it still does not fit, the loop stops with `context_budget`. Only the
conversation sent to the model is shortened: the store keeps every output as the tool returned it.

The reward is not the loop's business: the caller asks the environment's judge (`final_verdict`).
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from cudagym.agent.client import ChatClient, ClientError, Reply, Sampling, estimate_tokens

TOOL_FORMATS = ("auto", "native", "text")
STOP_REASONS = ("answer", "max_turns", "context_budget", "wall_time", "invalid_calls", "client_error")
SHORTENED_MARKER = "\n[cudagym: output shortened to fit the context budget: {dropped} of {total} characters dropped]"
TOOL_CALL_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|\Z)", re.DOTALL)

TEXT_TOOLS_PROMPT = """

# Tools

You call a tool by writing, anywhere in your reply, one block per call:
<tool_call>
{{"name": "<tool name>", "arguments": {{<arguments as a JSON object>}}}}
</tool_call>
The results come back in <tool_response> blocks. A reply without a <tool_call> block ends the task.
The tools:
<tools>
{tools}
</tools>"""


@dataclass(frozen=True)
class LoopConfig:
    max_turns: int = 150  # model queries; 150 for training rollouts, 200 for `agent eval`
    context_tokens: int = 32_768  # budget for prompt + answer (estimated; module docstring)
    wall_s: float = 3600.0  # one rollout's loop, model and tools included
    max_invalid_calls: int = 5  # consecutive tool calls that could not be run
    tool_format: str = "auto"  # auto | native | text
    keep_recent_outputs: int = 2  # newest tool outputs never shortened
    shortened_chars: int = 500  # what a shortened tool output keeps

    def __post_init__(self):
        if self.max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {self.max_turns}")
        if self.context_tokens < 256:
            raise ValueError(f"context_tokens must be >= 256, got {self.context_tokens}")
        if self.wall_s <= 0:
            raise ValueError(f"wall_s must be > 0, got {self.wall_s}")
        if self.max_invalid_calls < 1:
            raise ValueError(f"max_invalid_calls must be >= 1, got {self.max_invalid_calls}")
        if self.tool_format not in TOOL_FORMATS:
            raise ValueError(f"tool_format must be one of {', '.join(TOOL_FORMATS)}, got {self.tool_format!r}")
        if self.keep_recent_outputs < 0 or self.shortened_chars < 0:
            raise ValueError("keep_recent_outputs and shortened_chars must be >= 0")


class Environment(Protocol):
    """What the loop needs of cudagym.agent.environment.KernelEnv."""

    def tool_schemas(self) -> list[dict]: ...
    def system_prompt(self) -> str: ...
    def task_prompt(self) -> str: ...
    def execute(self, name: str, arguments: dict | str) -> Any: ...


class Recorder:
    """Where the loop reports as it goes; the store's RolloutRecorder writes DuckDB rows. No-op here."""

    def message(self, seq: int, turn: int, message: dict) -> None: ...
    def tool_call(self, call: "ToolCall", turn: int) -> None: ...
    def turn(self, turn: int, reply: Reply | ClientError) -> None: ...


@dataclass
class ToolCall:
    """One call the model asked for, and what came of it."""

    seq: int  # position among the rollout's tool calls
    call_id: str
    name: str
    arguments: str  # as the model wrote it (JSON text)
    format: str  # native | text
    valid: bool = True  # False: not run (unknown tool, arguments not a JSON object, unparsable block)
    ok: bool = False
    output: str = ""
    data: dict | None = None  # verify/profile: the verdict
    elapsed_s: float = 0.0
    build_s: float = 0.0


@dataclass
class LoopResult:
    stop_reason: str
    detail: str = ""
    turns: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    messages: list[dict] = field(default_factory=list)
    tool_calls: list[ToolCall] = field(default_factory=list)
    shortened: int = 0  # tool outputs shortened for the context budget


class Terminating(Exception):
    """The loop ends: `reason` is one of STOP_REASONS."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(f"{reason}: {detail}")
        self.reason, self.detail = reason, detail


# -- parsing ----------------------------------------------------------------------------------------
def parse_text_tool_calls(content: str) -> list[tuple[str, str, str | None]]:
    """(name, arguments JSON, error or None) per `<tool_call>` block of a text reply, in order.

    A block must hold a JSON object with a string `name` and `arguments` (an object, or a JSON
    string of one; missing: {}). A block that is not closed or does not parse is returned with an
    error, so the model is told instead of the call being dropped silently.
    """
    calls = []
    for match in TOOL_CALL_BLOCK.finditer(content or ""):
        raw = match.group(1)
        closed = match.group(0).rstrip().endswith("</tool_call>")
        try:
            block = json.loads(raw)
        except json.JSONDecodeError as e:
            calls.append(("", raw, f"tool call block is not JSON ({e.msg})" + ("" if closed else "; no </tool_call>")))
            continue
        if not isinstance(block, dict) or not isinstance(block.get("name"), str):
            calls.append(("", raw, 'tool call block must be {"name": "...", "arguments": {...}}'))
            continue
        arguments = block.get("arguments", block.get("parameters", {}))
        calls.append((block["name"], arguments if isinstance(arguments, str) else json.dumps(arguments), None))
    return calls


def parse_arguments(arguments: str) -> tuple[dict | None, str | None]:
    """The arguments as a dict, or the error to send back."""
    if not (arguments or "").strip():
        return {}, None
    try:
        value = json.loads(arguments)
    except json.JSONDecodeError as e:
        return None, f"arguments are not JSON ({e.msg} at char {e.pos})"
    if not isinstance(value, dict):
        return None, f"arguments must be a JSON object, got {type(value).__name__}"
    return value, None


# -- context budget ---------------------------------------------------------------------------------
def shorten(text: str, keep_chars: int) -> str:
    """`text` cut to its first keep_chars characters with the marker (unchanged when short enough)."""
    if len(text) <= keep_chars + len(SHORTENED_MARKER):
        return text
    return text[:keep_chars] + SHORTENED_MARKER.format(dropped=len(text) - keep_chars, total=len(text))


def fit_context(messages: list[dict], output_indices: list[int], budget_tokens: int, estimate, keep_recent: int,
                keep_chars: int, shortened: set[int]) -> bool:
    """Shorten tool outputs (indices into messages, oldest first; the newest keep_recent are kept)
    until estimate(messages) <= budget_tokens. Shortened indices go into `shortened`. True if it fits."""
    candidates = output_indices[:max(0, len(output_indices) - keep_recent)]
    for index in candidates:
        if index in shortened:  # before estimating: a long rollout has many
            continue
        if estimate(messages) <= budget_tokens:
            return True
        messages[index] = {**messages[index], "content": shorten(messages[index]["content"], keep_chars)}
        shortened.add(index)
    return estimate(messages) <= budget_tokens


# -- the loop ---------------------------------------------------------------------------------------
class Agent:
    """One rollout's conversation with the model over one environment."""

    def __init__(self, env: Environment, client: ChatClient, sampling: Sampling = Sampling(),
                 config: LoopConfig = LoopConfig(), recorder: Recorder | None = None):
        self.env, self.client, self.sampling, self.config = env, client, sampling, config
        self.recorder = recorder or Recorder()
        self.tools = env.tool_schemas()
        self.tool_names = [t["function"]["name"] for t in self.tools]
        self.messages: list[dict] = []
        self.result = LoopResult(stop_reason="")
        self._output_indices: list[int] = []  # messages holding tool outputs, oldest first
        self._shortened: set[int] = set()
        self._invalid_in_a_row = 0
        self._token_ratio = 1.0  # server prompt_tokens / our estimate, from the last reply with usage
        self._start = 0.0

    async def run(self) -> LoopResult:
        self._start = time.monotonic()
        system = self.env.system_prompt()
        if self.config.tool_format == "text":
            system += TEXT_TOOLS_PROMPT.format(tools="\n".join(json.dumps(t["function"]) for t in self.tools))
        self.add({"role": "system", "content": system})
        self.add({"role": "user", "content": self.env.task_prompt()})
        try:
            while True:
                await self.step()
        except Terminating as stop:
            self.result.stop_reason, self.result.detail = stop.reason, stop.detail
        self.result.messages = self.messages
        self.result.shortened = len(self._shortened)
        return self.result

    def add(self, message: dict, output: bool = False) -> None:
        if output:
            self._output_indices.append(len(self.messages))
        self.recorder.message(len(self.messages), self.result.turns, message)
        self.messages.append(message)

    async def step(self) -> None:
        self.check_limits()
        self.fit_context()
        reply = await self.query()
        calls = self.parse(reply)
        if not calls:
            raise Terminating("answer", (reply.message.get("content") or "")[:200])
        await self.execute_all(calls)

    def check_limits(self) -> None:
        if self.result.turns >= self.config.max_turns:
            raise Terminating("max_turns", f"{self.result.turns} turns")
        if time.monotonic() - self._start > self.config.wall_s:
            raise Terminating("wall_time", f"over {self.config.wall_s:g} s")

    def estimate(self, messages: list[dict]) -> int:
        tools = self.tools if self.config.tool_format != "text" else None
        return int(estimate_tokens(messages, tools) * self._token_ratio)

    def fit_context(self) -> None:
        budget = self.config.context_tokens - (self.sampling.max_tokens or 0)
        if not fit_context(self.messages, self._output_indices, budget, self.estimate, self.config.keep_recent_outputs,
                           self.config.shortened_chars, self._shortened):
            raise Terminating("context_budget", f"~{self.estimate(self.messages)} prompt tokens + "
                                                f"{self.sampling.max_tokens or 0} for the answer > {self.config.context_tokens}")

    async def query(self) -> Reply:
        tools = self.tools if self.config.tool_format != "text" else None
        remaining = self.config.wall_s - (time.monotonic() - self._start)
        self.result.turns += 1
        try:
            reply = await asyncio.wait_for(self.client.chat(list(self.messages), tools, self.sampling),
                                           timeout=max(remaining, 0.001))
        except asyncio.TimeoutError:
            raise Terminating("wall_time", f"over {self.config.wall_s:g} s waiting for the model") from None
        self.recorder.turn(self.result.turns, reply)
        if isinstance(reply, ClientError):
            raise Terminating("client_error", f"{reply.reason}: {reply.detail}")
        self.result.prompt_tokens += reply.prompt_tokens
        self.result.completion_tokens += reply.completion_tokens
        if reply.usage_source == "server" and reply.prompt_tokens > 0:
            estimated = estimate_tokens(self.messages, tools)
            self._token_ratio = min(4.0, max(0.5, reply.prompt_tokens / max(estimated, 1)))
        self.add(reply.message)
        return reply

    def parse(self, reply: Reply) -> list[ToolCall]:
        """The calls of a reply: native tool_calls, else (unless tool_format is native) text blocks."""
        calls = []
        n = len(self.result.tool_calls)
        for call in reply.message.get("tool_calls") or ():
            calls.append(ToolCall(n + len(calls), call["id"], call["function"]["name"], call["function"]["arguments"],
                                  "native"))
        if not calls and self.config.tool_format != "native":
            for i, (name, arguments, error) in enumerate(parse_text_tool_calls(reply.message.get("content") or "")):
                call = ToolCall(n + len(calls), f"text_{self.result.turns}_{i}", name, arguments, "text")
                if error:
                    call.valid, call.output = False, f"error: {error}"
                calls.append(call)
        return calls

    async def execute_all(self, calls: list[ToolCall]) -> None:
        for call in calls:
            await self.execute(call)
            self.result.tool_calls.append(call)
            self.recorder.tool_call(call, self.result.turns)
            if call.format == "native":
                self.add({"role": "tool", "tool_call_id": call.call_id, "content": call.output}, output=True)
            self._invalid_in_a_row = 0 if call.valid else self._invalid_in_a_row + 1
        text = [c for c in calls if c.format == "text"]
        if text:  # one user message answering every text call of the reply, in order
            self.add({"role": "user", "content": "\n".join(f"<tool_response>\n{c.output}\n</tool_response>" for c in text)},
                     output=True)
        if self._invalid_in_a_row >= self.config.max_invalid_calls:
            raise Terminating("invalid_calls", f"{self._invalid_in_a_row} invalid tool calls in a row")

    async def execute(self, call: ToolCall) -> None:
        if not call.valid:
            return
        if call.name not in self.tool_names:
            call.valid, call.output = False, f"error: unknown tool {call.name!r}; the tools are: {', '.join(self.tool_names)}"
            return
        arguments, error = parse_arguments(call.arguments)
        if error:
            call.valid, call.output = False, f"error: {call.name}: {error}"
            return
        start = time.monotonic()
        try:
            result = await asyncio.to_thread(self.env.execute, call.name, arguments)
        except Exception as e:  # the environment promises not to raise; if it does, the model is told and we go on
            call.ok, call.output = False, f"error: {call.name} failed: {type(e).__name__}: {e}"[:2000]
            call.elapsed_s = time.monotonic() - start
            return
        call.ok, call.output, call.data = bool(result.ok), result.output, result.data
        call.elapsed_s, call.build_s = float(result.elapsed_s or time.monotonic() - start), float(result.build_s or 0.0)
