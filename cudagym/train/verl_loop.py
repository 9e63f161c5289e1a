"""cudagym's agent environment as a verl agent loop: `CudagymAgentLoop`, registered as "cudagym_agent".

verl (>= 0.9, `verl.experimental.agent_loop`) runs one `AgentLoopBase.run()` per dataset row and
trains on what it returns: prompt ids, response ids, a response mask (1: sampled by the model, 0:
written by the environment) and a reward. This loop fills those from cudagym's own pieces:

- the environment is `cudagym.agent.environment.KernelEnv` (a fresh workdir per rollout, the tools
  in their sandbox, the judge); the reward is its `final_verdict().reward`, the milestone reward
  (-1 incorrect, 1 correct, 2 faster than eager, 3 faster than eager and torch.compile);
- the conversation is run by cudagym's ReAct loop, `cudagym.agent.loop.Agent`, in its text tool
  format (`<tool_call>` blocks in the reply, every output of a reply back in one user message of
  `<tool_response>` blocks): parsing, tool execution, invalid calls and max_turns are the loop's;
- the model is verl's: the loop's chat client here (`VerlTokenClient`) keeps the token stream the
  way verl's own `ToolAgentLoop` does (token-in / token-out): the first prompt and each new batch
  of tool outputs are tokenized by verl's Continuous Token builder (`ct_build_initial_tokens`,
  `ct_merge_context_msg`: mask 0), the ids `server_manager.generate` sampled are appended as they
  are (`ct_merge_assistant_token`: mask 1, with their log-probs), and only the loop sees them as
  text (`tokenizer.decode`). So no sampled token is re-tokenised, unlike cudagym.train.data, which
  rebuilds tokens from stored text.

Select it with `actor_rollout_ref.rollout.agent.default_agent_loop=cudagym_agent`, or per row with
the dataset column `agent_name`; verl's workers find it through the packaged verl_agent_loop.yaml
(`actor_rollout_ref.rollout.agent.agent_loop_config_path`). Rows carry the task in `extra_info["cudagym_task"]` (`dataset_row`
writes one); the row's prompt is not used: the environment writes the system and task prompts.
Settings (all optional) come from a `cudagym` section of verl's config (`+cudagym.env.device=cuda`):
`env` (EnvConfig fields), `loop` (LoopConfig's max_turns, wall_s, max_invalid_calls; max_turns
defaults to `multi_turn.max_assistant_turns` when that is set) and `workdirs` (where workdirs go;
default the system temp folder). A workdir is removed once the rollout is judged.

The episode ends as the loop ends it (an answer without a tool call, max_turns, invalid calls, wall
time), or, as in ToolAgentLoop, when a reply brings the response to `rollout.response_length` (its
tool calls are not run; the response is cut to that length) or tool outputs would (they are not
appended): stop reason `context_budget`. Tool outputs of the last reply are never appended, so the
response ends with model tokens and verl's reward, which it puts on the last response token, lands
on a model token.

verl is imported here only; nothing in cudagym imports this module at import time. Exercised on the
CPU with a scripted token source in place of the inference server (tests/train/test_verl_loop.py);
no verl training run on a GPU has been made with it.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any
from uuid import uuid4

from omegaconf import DictConfig, OmegaConf
from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopMetrics, AgentLoopOutput, register

from cudagym.agent.client import ClientError, Reply, Sampling
from cudagym.agent.environment import EnvConfig, KernelEnv
from cudagym.agent.loop import Agent, LoopConfig, Terminating
from cudagym.agent.rollout import _remove_tree
from cudagym.tasks import Task

AGENT_NAME = "cudagym_agent"
TASK_KEY = "cudagym_task"  # the key of a row's extra_info that holds the task
LOOP_SETTINGS = ("max_turns", "wall_s", "max_invalid_calls")
# The loop estimates tokens from text to shorten old tool outputs; here the token stream is exact and
# its length is checked against response_length, so the loop's own budget must never trigger.
UNBOUNDED_CONTEXT = 1 << 40


def dataset_row(task: Task, agent_name: str = AGENT_NAME) -> dict:
    """One row of a verl RL dataset (parquet) for `task`: RLHFDataset needs a prompt column (here the
    task's code, for its length filter and logs; the loop writes the real prompts itself)."""
    return {"data_source": "cudagym", "agent_name": agent_name,
            "prompt": [{"role": "user", "content": task.code}],
            "extra_info": {TASK_KEY: {"id": task.id, "name": task.name, "code": task.code, "level": task.level,
                                      "problem_id": task.problem_id, "source": task.source}}}


class VerlTokenClient:
    """The loop's chat client (`chat(messages, tools, sampling) -> Reply | ClientError`) over verl's
    `server_manager.generate`, keeping the token stream, its mask and log-probs (module docstring)."""

    def __init__(self, agent_loop: AgentLoopBase, sampling_params: dict[str, Any], request_id: str,
                 response_length: int):
        self.agent_loop, self.sampling_params = agent_loop, sampling_params
        self.request_id, self.response_length = request_id, response_length
        self.prompt_ids: list[int] = []
        self.token_ids: list[int] = []  # prompt + response, as the server sees it
        self.response_mask: list[int] = []
        self.response_logprobs: list[float] = []
        self.seen: list[dict] = []  # the messages already in token_ids, as they were when tokenized
        self.model_turns = 0
        self.context_turns = 0  # tool-output messages merged
        self.generate_s = 0.0

    async def chat(self, messages: list[dict], tools, sampling: Sampling) -> Reply | ClientError:
        loop = self.agent_loop
        if not self.seen:
            # verl's ct_build_initial_tokens would left-truncate a long prompt: here that cuts the system
            # prompt (the instructions and the tool list), so a prompt that does not fit is refused
            prompt_ids = await asyncio.get_running_loop().run_in_executor(
                None, loop.continuous_token_builder.build_initial_tokens, messages)
            limit = loop.rollout_config.prompt_length
            if len(prompt_ids) > limit:
                raise ValueError(f"{AGENT_NAME}: the system and task prompts take {len(prompt_ids)} tokens, more "
                                 f"than actor_rollout_ref.rollout.prompt_length={limit}; raise it")
            self.prompt_ids = prompt_ids
            self.token_ids = list(self.prompt_ids)
            self.seen = list(messages)
        else:
            # Only messages after those already tokenized are new: the loop's copy of earlier ones is
            # not read again (the token stream is what the model saw).
            new = messages[len(self.seen):]
            merged, mask, logprobs = await loop.ct_merge_context_msg(
                self.seen, self.seen + new, self.token_ids, self.response_mask, self.response_logprobs or None)
            if len(mask) >= self.response_length:
                # as ToolAgentLoop: outputs that would fill the response end the episode, not appended
                raise Terminating("context_budget", f"tool outputs would take the response past {self.response_length} tokens")
            self.token_ids, self.response_mask, self.response_logprobs = merged.token_ids, mask, logprobs or []
            self.seen += new
            self.context_turns += len(new)
        start = time.monotonic()
        output = await loop.server_manager.generate(request_id=self.request_id, prompt_ids=self.token_ids,
                                                    sampling_params=self.sampling_params)
        self.generate_s += time.monotonic() - start
        self.model_turns += 1
        # As ToolAgentLoop: log-probs are kept when the server gives them, for every model token.
        merged, self.response_mask, logprobs = await loop.ct_merge_assistant_token(
            self.token_ids, output.token_ids, self.response_mask,
            self.response_logprobs if (self.response_logprobs or output.log_probs) else None,
            assistant_logprobs=output.log_probs or None)
        self.token_ids = merged.token_ids
        self.response_logprobs = logprobs or []
        text = loop.tokenizer.decode(output.token_ids, skip_special_tokens=True)
        message = {"role": "assistant", "content": text}
        self.seen.append(message)
        if len(self.response_mask) >= self.response_length:
            # as ToolAgentLoop: a full response ends the episode and the reply's tool calls are not run
            raise Terminating("context_budget", f"response reached {self.response_length} tokens")
        return Reply(message=message, finish_reason=output.stop_reason, prompt_tokens=len(self.token_ids) - len(output.token_ids),
                     completion_tokens=len(output.token_ids), usage_source="server",
                     latency_s=time.monotonic() - start, attempts=1)

    def response_ids(self) -> list[int]:
        return self.token_ids[len(self.prompt_ids):]


@register(AGENT_NAME)
class CudagymAgentLoop(AgentLoopBase):
    """One rollout of cudagym's agent environment per `run()` (module docstring)."""

    def __init__(self, *args, tools=None, **kwargs):
        # `tools`: verl's own tool list (multi_turn.tool_config_path); the environment brings its own.
        super().__init__(*args, **kwargs)
        settings = self.config.get("cudagym") or {}
        settings = OmegaConf.to_container(settings, resolve=True) if isinstance(settings, DictConfig) else dict(settings)
        self.env_config = EnvConfig(**(settings.get("env") or {}))
        loop = dict(settings.get("loop") or {})
        unknown = set(loop) - set(LOOP_SETTINGS)
        if unknown:
            raise ValueError(f"cudagym.loop: unknown settings {sorted(unknown)}; known: {', '.join(LOOP_SETTINGS)}")
        max_assistant_turns = OmegaConf.select(self.rollout_config, "multi_turn.max_assistant_turns")
        if max_assistant_turns and "max_turns" not in loop:
            loop["max_turns"] = max_assistant_turns
        self.loop_config = LoopConfig(**loop, tool_format="text", context_tokens=UNBOUNDED_CONTEXT)
        self.workdirs = Path(settings.get("workdirs") or tempfile.gettempdir())
        self.response_length = self.rollout_config.response_length

    async def run(self, sampling_params: dict[str, Any], **kwargs) -> AgentLoopOutput:
        fields = (kwargs.get("extra_info") or {}).get(TASK_KEY)
        if not fields:
            raise ValueError(f"{AGENT_NAME}: the row has no extra_info[{TASK_KEY!r}] (cudagym.train.verl_loop.dataset_row)")
        task = Task(**fields)
        client = VerlTokenClient(self, sampling_params, uuid4().hex, self.response_length)
        self.workdirs.mkdir(parents=True, exist_ok=True)
        workdir = Path(tempfile.mkdtemp(prefix="cudagym-verl-", dir=self.workdirs)) / "wd"
        env = None
        try:
            env = await asyncio.to_thread(KernelEnv, task, workdir, self.env_config)
            # the client ignores the loop's Sampling: verl's sampling_params go to the server as they are
            result = await Agent(env, client, Sampling(max_tokens=None), self.loop_config).run()
            verdict = await asyncio.to_thread(env.final_verdict)
        finally:
            if env is not None:
                await asyncio.to_thread(env.close)
            await asyncio.to_thread(_remove_tree, workdir.parent)
        n = self.response_length
        metrics = AgentLoopMetrics(generate_sequences=client.generate_s,
                                   tool_calls=sum(call.elapsed_s for call in result.tool_calls))
        return AgentLoopOutput(
            prompt_ids=client.prompt_ids, response_ids=client.response_ids()[:n], response_mask=client.response_mask[:n],
            response_logprobs=client.response_logprobs[:n] or None, reward_score=float(verdict.reward),
            # verl counts the prompt, each model turn and each appended message (ToolAgentLoop's num_turns)
            num_turns=1 + client.model_turns + client.context_turns, metrics=metrics,
            # turn_scores and tool_rewards: verl's batch concatenation expects them from every loop
            extra_fields={"turn_scores": [], "tool_rewards": [], "cudagym_stop_reason": result.stop_reason,
                          "cudagym_verdict": verdict.to_dict(),
                          "cudagym_tool_calls": [{"name": c.name, "ok": c.ok, "valid": c.valid} for c in result.tool_calls]})
