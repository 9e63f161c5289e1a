"""Trajectories -> token samples for training: prompt ids, response ids, response mask, rewards.

A trajectory is an OpenAI-format conversation (system, user, then assistant turns with tool calls
and the tool outputs / environment messages between them). Training needs it as tokens in the
model's own chat template, with the response mask telling the model's tokens (1) from everything
the environment wrote (0): tool outputs, user messages, and the template's own role headers.

How: the conversation is rendered with `tokenizer.apply_chat_template` one message longer at a time;
the text each message adds is its span. For an assistant message, the span starts after the
generation prompt (`add_generation_prompt=True` of the conversation before it: the role header is
the template's, mask 0) and the model's part ends with the end-of-turn token (the tokenizer's
eos_token by default, e.g. `<|im_end|>`): what the template adds after it (a newline) is mask 0,
since the model stops at the end-of-turn token and never samples it. Each span is tokenized on its
own, so no token straddles a model/environment boundary. A template that rewrites earlier turns
(one that drops past reasoning, say) breaks the "one message longer" prefix property and is refused
with a TemplateError rather than producing a wrong mask.

Tool calls: a template that renders `tool_calls` gets them as they are (and `tools`, the schemas, for
its system prompt); for one that does not (SmolLM2's, for example) the conversation is first put in
the agent loop's text tool format (cudagym.agent.loop, Hermes style): calls as
`<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks in the assistant's content, tool
outputs as `<tool_response>` blocks in one user message, and, when `tools` are given and the system
message has no `<tools>` block yet, the loop's text-mode tool prompt appended to it, so that the
sample reads as if the rollout had been run in text mode.

This is a re-tokenisation of text: the ids the server sampled may differ at a few boundaries (verl's
agent loop avoids that by keeping the sampled ids, token-in / token-out). The episode's reward goes on
the last model token; verify results stay attached to the last token of the turn that called verify.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import torch

from cudagym.agent.loop import TEXT_TOOLS_PROMPT
from cudagym.train.ppo import PPOBatch
from cudagym.train.trajectories import Trajectory


class TemplateError(ValueError):
    """The chat template cannot give a faithful token mask for this conversation."""


@dataclass(frozen=True)
class Sample:
    rollout_id: str
    prompt_ids: tuple[int, ...]
    response_ids: tuple[int, ...]
    response_mask: tuple[int, ...]  # 1: sampled by the model; 0: tool output, environment, template
    token_rewards: tuple[float, ...]  # the reward on the last model token, 0 elsewhere
    reward: float
    verify_results: tuple[dict, ...] = ()  # {"turn", "token" (response index or None), "data"} per verify call


def template_renders_tool_calls(tokenizer) -> bool:
    return "tool_calls" in (getattr(tokenizer, "chat_template", None) or "")


def to_text_tool_format(messages: list[dict], tools: list[dict] | None = None) -> list[dict]:
    """Native tool calls and tool messages as the agent loop's text format (Hermes / Qwen style);
    with `tools`, the loop's text-mode tool prompt goes into a system message that has none."""
    out: list[dict] = []
    if tools and messages and messages[0].get("role") == "system" and "<tools>" not in (messages[0].get("content") or ""):
        listing = "\n".join(json.dumps(t["function"]) for t in tools)
        messages = [{**messages[0], "content": (messages[0].get("content") or "") + TEXT_TOOLS_PROMPT.format(tools=listing)},
                    *messages[1:]]
    responses: list[str] = []
    for message in messages:
        if message.get("role") == "tool":
            responses.append(f"<tool_response>\n{message.get('content') or ''}\n</tool_response>")
            continue
        if responses:  # the loop answers all text calls of a reply in one user message
            out.append({"role": "user", "content": "\n".join(responses)})
            responses = []
        if message.get("role") == "assistant" and message.get("tool_calls"):
            blocks = []
            for call in message["tool_calls"]:
                arguments = call["function"].get("arguments") or "{}"
                try:
                    arguments = json.loads(arguments) if isinstance(arguments, str) else arguments
                except json.JSONDecodeError:
                    pass  # kept as the string the model wrote
                blocks.append("<tool_call>\n" + json.dumps({"name": call["function"]["name"], "arguments": arguments}) + "\n</tool_call>")
            content = message.get("content") or ""
            message = {"role": "assistant", "content": (content + "\n" if content else "") + "\n".join(blocks)}
        out.append({k: v for k, v in message.items() if k in ("role", "content", "tool_calls", "tool_call_id", "name")})
    if responses:
        out.append({"role": "user", "content": "\n".join(responses)})
    return out


def _clean(messages: list[dict]) -> list[dict]:
    # templates concatenate content: None (an assistant turn that only calls tools) must be ""
    return [{**m, "content": m.get("content") or ""} for m in messages]


def tokenize_trajectory(trajectory: Trajectory, tokenizer, tools: list[dict] | None = None,
                        end_of_turn: str | None = None) -> Sample:
    """One trajectory -> a Sample in `tokenizer`'s chat template (module docstring for the method).
    `tools`: the OpenAI tool schemas the rollout was offered (KernelEnv.tool_schemas())."""
    if trajectory.reward is None:
        raise ValueError(f"{trajectory.rollout_id}: trajectory has no reward")
    messages = list(trajectory.messages)
    if not template_renders_tool_calls(tokenizer):
        messages, tools = to_text_tool_format(messages, tools), None
    messages = _clean(messages)
    first = next((i for i, m in enumerate(messages) if m["role"] == "assistant"), None)
    if first is None:
        raise ValueError(f"{trajectory.rollout_id}: trajectory has no model turn")
    end_of_turn = end_of_turn or tokenizer.eos_token

    def render(upto: int, generation_prompt: bool = False) -> str:
        return tokenizer.apply_chat_template(messages[:upto], tools=tools, tokenize=False,
                                             add_generation_prompt=generation_prompt)

    def follow(text: str, prefix: str, i: int) -> str:
        if not text.startswith(prefix):
            raise TemplateError(f"{trajectory.rollout_id}: the chat template rewrites earlier text at message {i}"
                                " (not prefix-stable); cannot mask it faithfully")
        return text[len(prefix):]

    prompt_text = render(first, generation_prompt=True)
    spans: list[tuple[str, int, int | None]] = []  # (text, mask, model turn number or None)
    covered = prompt_text
    model_turn = 0
    for i in range(first, len(messages)):
        full = render(i + 1)
        if messages[i]["role"] == "assistant":
            model_turn += 1
            generation_prefix = render(i, generation_prompt=True)
            spans.append((follow(generation_prefix, covered, i), 0, None))  # the role header
            body = follow(full, generation_prefix, i)
            cut = body.rfind(end_of_turn)
            cut = len(body) if cut < 0 else cut + len(end_of_turn)
            spans.append((body[:cut], 1, model_turn))
            spans.append((body[cut:], 0, None))  # what the template adds after the end-of-turn token
        else:
            spans.append((follow(full, covered, i), 0, None))
        covered = full

    def encode(text: str) -> list[int]:
        return tokenizer(text, add_special_tokens=False)["input_ids"] if text else []

    response_ids: list[int] = []
    response_mask: list[int] = []
    turn_end: dict[int, int] = {}  # model turn number -> response index of its last token
    for text, mask, turn in spans:
        ids = encode(text)
        response_ids += ids
        response_mask += [mask] * len(ids)
        if turn is not None and ids:
            turn_end[turn] = len(response_ids) - 1
    model_positions = [t for t, m in enumerate(response_mask) if m]
    if not model_positions:
        raise ValueError(f"{trajectory.rollout_id}: the model turns are empty")
    token_rewards = [0.0] * len(response_ids)
    token_rewards[model_positions[-1]] = float(trajectory.reward)
    verify = tuple({**v, "token": turn_end.get(v["turn"])} for v in trajectory.verify_results())
    return Sample(trajectory.rollout_id, tuple(encode(prompt_text)), tuple(response_ids), tuple(response_mask),
                  tuple(token_rewards), float(trajectory.reward), verify)


def collate(samples: list[Sample], pad_id: int) -> PPOBatch:
    """Samples -> a PPOBatch: prompts left-padded, responses right-padded (the layout verl uses)."""
    prompt_len = max(len(s.prompt_ids) for s in samples)
    response_len = max(len(s.response_ids) for s in samples)
    n = len(samples)
    input_ids = torch.full((n, prompt_len + response_len), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((n, prompt_len + response_len), dtype=torch.long)
    response_mask = torch.zeros((n, response_len), dtype=torch.float32)
    token_rewards = torch.zeros((n, response_len), dtype=torch.float32)
    for row, s in enumerate(samples):
        p, r = len(s.prompt_ids), len(s.response_ids)
        input_ids[row, prompt_len - p : prompt_len] = torch.tensor(s.prompt_ids, dtype=torch.long)
        input_ids[row, prompt_len : prompt_len + r] = torch.tensor(s.response_ids, dtype=torch.long)
        attention_mask[row, prompt_len - p : prompt_len + r] = 1
        response_mask[row, :r] = torch.tensor(s.response_mask, dtype=torch.float32)
        token_rewards[row, :r] = torch.tensor(s.token_rewards, dtype=torch.float32)
    return PPOBatch(input_ids, attention_mask, response_mask, token_rewards)
