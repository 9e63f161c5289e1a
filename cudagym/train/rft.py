"""Rejection fine-tuning (RFT): which agent rollouts the actor is fine-tuned on.

CUDA Agent fine-tunes the actor on its own good rollouts before PPO (without this step its
faster-than-compile rate fell from 96.8% to 49.8%). A rollout is kept when its reward clears a
threshold and its behaviour is one we want imitated. The rules, each a named drop reason:

- `no_reward`: never judged (reward None);
- `low_reward`: reward <= `min_reward`. The milestone rewards are -1 (wrong), 1 (correct), 2 (faster
  than eager), 3 (faster than torch.compile); the default threshold 1 keeps 2 and 3;
- `unfinished`: the loop did not end with a clean stop: stop_reason other than `answer` (max turns,
  context budget, wall time, too many invalid calls, client error), the last model turn cut off by
  the server (finish_reason `length`), or a conversation that does not end on a model message;
- `unknown_tool`: a call to a tool outside `tool_names` (the environment's tools; the caller passes
  cudagym.agent.environment.TOOL_NAMES);
- `invalid_call`: a call the loop could not run (`valid` false: arguments not a JSON object, a broken
  `<tool_call>` block, or an unknown tool when no `tool_names` are given);
- `repeated_call`: the same tool with the same arguments more than `max_identical_calls_in_a_row`
  times in a row (a loop the model is stuck in: nothing changed between the calls).

The step has the shape of the other pipeline steps (cudagym.dedup.decontaminate.Decontaminate):
`run(trajectories)` yields the kept ones, `stats` counts `in`, `kept`, `dropped_<reason>`, and an
optional `rejects(trajectory, reason)` sees every drop. Writing the kept set as a `datasets`
dataset and the fine-tuning itself are not built yet (docs/train.md).
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from cudagym.train.trajectories import Trajectory

log = logging.getLogger(__name__)

CLEAN_STOP_REASONS = ("answer",)  # cudagym.agent.loop: a reply without a tool call ends the task
CLEAN_FINISH_REASONS = ("stop", None)  # None: the server did not say (text-mode scripted servers)
DROP_REASONS = ("no_reward", "low_reward", "unfinished", "unknown_tool", "invalid_call", "repeated_call")


@dataclass(frozen=True)
class RFTConfig:
    min_reward: float = 1.0  # keep reward > min_reward: 2 (faster than eager) and 3 (faster than compile)
    max_identical_calls_in_a_row: int = 1  # 1: a call identical to the one just before is a repeat
    tool_names: tuple[str, ...] | None = None  # the environment's tools; None: the loop's `valid` only

    def __post_init__(self) -> None:
        if self.max_identical_calls_in_a_row < 1:
            raise ValueError(f"max_identical_calls_in_a_row must be >= 1, got {self.max_identical_calls_in_a_row}")


def _canonical_arguments(arguments: str) -> str:
    """Arguments as sorted JSON so that key order and spacing do not hide a repeat."""
    try:
        return json.dumps(json.loads(arguments), sort_keys=True)
    except (json.JSONDecodeError, TypeError):
        return (arguments or "").strip()


def longest_identical_run(trajectory: Trajectory) -> int:
    """The longest run of consecutive tool calls with the same name and arguments (0 without calls)."""
    longest, run, previous = 0, 0, None
    for call in trajectory.tool_calls:
        key = (call.name, _canonical_arguments(call.arguments))
        run = run + 1 if key == previous else 1
        previous = key
        longest = max(longest, run)
    return longest


def ended_cleanly(trajectory: Trajectory) -> bool:
    last = trajectory.messages[-1] if trajectory.messages else None
    return (
        trajectory.stop_reason in CLEAN_STOP_REASONS
        and trajectory.finish_reason in CLEAN_FINISH_REASONS
        and last is not None
        and last.get("role") == "assistant"
        and not last.get("tool_calls")
    )


def drop_reason(trajectory: Trajectory, config: RFTConfig) -> str | None:
    """The first rule of DROP_REASONS that the trajectory breaks, or None to keep it."""
    if trajectory.reward is None:
        return "no_reward"
    if trajectory.reward <= config.min_reward:
        return "low_reward"
    if not ended_cleanly(trajectory):
        return "unfinished"
    for call in trajectory.tool_calls:
        if config.tool_names is not None and call.name not in config.tool_names:
            return "unknown_tool"
        if not call.valid:
            return "invalid_call"
    if longest_identical_run(trajectory) > config.max_identical_calls_in_a_row:
        return "repeated_call"
    return None


class RFTSelect:
    """Pipeline step: keep the trajectories worth imitating (module docstring for the rules)."""

    name = "rft_select"

    def __init__(self, config: RFTConfig = RFTConfig(), rejects: Callable[[Trajectory, str], None] | None = None):
        self.config, self.rejects = config, rejects
        self.stats: Counter = Counter()

    def run(self, trajectories: Iterable[Trajectory]) -> Iterator[Trajectory]:
        for trajectory in trajectories:
            self.stats["in"] += 1
            reason = drop_reason(trajectory, self.config)
            if reason:
                self.stats[f"dropped_{reason}"] += 1
                log.debug("%s: dropped (%s)", trajectory.rollout_id, reason)
                if self.rejects:
                    self.rejects(trajectory, reason)
                continue
            self.stats["kept"] += 1
            yield trajectory
