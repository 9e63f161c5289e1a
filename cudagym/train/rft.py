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
- `unknown_tool`: a call to a tool outside `tool_names` (default: the kernel environment's,
  cudagym.agent.environment.TOOL_NAMES);
- `invalid_call`: a call the loop could not run (`valid` false: arguments not a JSON object, a broken
  `<tool_call>` block, or an unknown tool when no `tool_names` are given);
- `repeated_call`: the same tool with the same arguments more than `max_identical_calls_in_a_row`
  times in a row (a loop the model is stuck in: nothing changed between the calls).

The step has the shape of the other pipeline steps (cudagym.dedup.decontaminate.Decontaminate):
`run(trajectories)` yields the kept ones, `stats` counts `in`, `kept`, `dropped_<reason>`, and an
optional `rejects(trajectory, reason)` sees every drop. `write_dataset` writes the kept set as a
`datasets` folder in chat format with tool calls (parquet + a card with the selection's counts),
which `datasets.load_dataset(folder)` reads. The fine-tuning is cudagym.train.sft.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from cudagym.agent.environment import TOOL_NAMES
from cudagym.train.trajectories import Trajectory

log = logging.getLogger(__name__)

CLEAN_STOP_REASONS = ("answer",)  # cudagym.agent.loop: a reply without a tool call ends the task
CLEAN_FINISH_REASONS = ("stop", None)  # None: the server did not say (text-mode scripted servers)
DROP_REASONS = ("no_reward", "low_reward", "unfinished", "unknown_tool", "invalid_call", "repeated_call")


@dataclass(frozen=True)
class RFTConfig:
    min_reward: float = 1.0  # keep reward > min_reward: 2 (faster than eager) and 3 (faster than compile)
    max_identical_calls_in_a_row: int = 1  # 1: a call identical to the one just before is a repeat
    tool_names: tuple[str, ...] | None = TOOL_NAMES  # the kernel environment's tools; None: the loop's `valid` only

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


# --- the kept set as a `datasets` folder ---------------------------------------------------------

PARQUET_PATH = "data/train-00000-of-00001.parquet"  # the name push_to_hub gives a single shard


def _features():
    import datasets

    tool_call = {"id": datasets.Value("string"), "type": datasets.Value("string"),
                 "function": {"name": datasets.Value("string"), "arguments": datasets.Value("string")}}
    message = {"role": datasets.Value("string"), "content": datasets.Value("string"),
               "tool_calls": datasets.List(tool_call), "tool_call_id": datasets.Value("string")}
    return datasets.Features({"rollout_id": datasets.Value("string"), "task_id": datasets.Value("string"),
                              "reward": datasets.Value("float64"), "stop_reason": datasets.Value("string"),
                              "messages": datasets.List(message)})


def to_row(trajectory: Trajectory) -> dict:
    """One dataset row: the conversation in OpenAI chat format (tool call arguments as JSON text)."""
    messages = []
    for m in trajectory.messages:
        calls = [{"id": c.get("id") or "", "type": c.get("type") or "function",
                  "function": {"name": c["function"]["name"], "arguments": c["function"].get("arguments") or "{}"}}
                 for c in m.get("tool_calls") or ()]
        messages.append({"role": m["role"], "content": m.get("content") or "", "tool_calls": calls,
                         "tool_call_id": m.get("tool_call_id")})
    return {"rollout_id": trajectory.rollout_id, "task_id": trajectory.task_id, "reward": trajectory.reward,
            "stop_reason": trajectory.stop_reason, "messages": messages}


def render_card(n_rows: int, stats: Counter, config: RFTConfig) -> str:
    from cudagym.synth.publish import size_category

    counts = "\n".join(f"| {key} | {value} |" for key, value in sorted(stats.items()))
    settings = "\n".join(f"| {key} | {value} |" for key, value in asdict(config).items())
    return f"""---
configs:
- config_name: default
  data_files:
  - split: train
    path: {PARQUET_PATH}
size_categories:
- {size_category(n_rows)}
tags:
- cudagym
- rejection-fine-tuning
- tool-use
---

# cudagym RFT set: {n_rows} agent rollouts kept for rejection fine-tuning

Rollouts of the cudagym agent environment selected by `cudagym.train.rft.RFTSelect`: reward above
`min_reward`, a clean ending, no unknown or invalid tool calls, no identical calls repeated in a row.
Each row is one rollout's conversation in OpenAI chat format (`messages`: role, content,
`tool_calls` with JSON `arguments`, `tool_call_id`), with its judge reward (-1 wrong, 1 correct,
2 faster than eager, 3 faster than torch.compile). Train on the assistant turns only.

## Selection

| count | n |
| --- | --- |
{counts}

## Settings

| setting | value |
| --- | --- |
{settings}
"""


def write_dataset(trajectories: Iterable[Trajectory], folder: str | Path, stats: Counter, config: RFTConfig) -> Path:
    """Write the kept trajectories as `folder/README.md` + `folder/PARQUET_PATH` (loadable with
    `datasets.load_dataset(folder)`). The files are written to a sibling temporary folder renamed into
    place, so a killed run leaves no half folder; an existing `folder` is refused."""
    import datasets

    folder = Path(folder)
    if folder.exists():
        raise FileExistsError(f"{folder} already exists; remove it or choose another folder")
    rows = [to_row(t) for t in trajectories]
    dataset = datasets.Dataset.from_list(rows, features=_features())
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", suffix=".tmp", dir=folder.parent))
    try:
        (tmp / PARQUET_PATH).parent.mkdir(parents=True)
        dataset.to_parquet(str(tmp / PARQUET_PATH))
        (tmp / "README.md").write_text(render_card(len(rows), stats, config))
        tmp.chmod(0o755)
        os.rename(tmp, folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log.info("wrote %s (%d rollouts)", folder, len(rows))
    return folder
