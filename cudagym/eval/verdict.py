"""The verdict: one JSON object per candidate (schema in the contract), and the milestone reward."""

from __future__ import annotations

import enum
import json
from dataclasses import asdict, dataclass, field, fields


class Status(str, enum.Enum):
    PASS = "pass"
    INCORRECT = "incorrect"
    COMPILE_ERROR = "compile_error"
    RUNTIME_ERROR = "runtime_error"
    TIMEOUT = "timeout"
    REJECTED = "rejected"


@dataclass
class Verdict:
    status: Status
    level: int | None = None
    problem_id: int | None = None
    name: str | None = None
    kb_version: str | None = None
    correct: bool = False
    reason: str | None = None  # one line, for every status but pass
    flags: list[str] = field(default_factory=list)  # hack checks that fired; names are stable
    t_candidate_ms: float | None = None  # medians; None when not timed
    t_eager_ms: float | None = None
    t_compile_ms: float | None = None
    speedup_vs_eager: float | None = None
    speedup_vs_compile: float | None = None
    reward: int = -1
    timing_mode: str = "strict"
    precision: str = "strict"  # "strict" (fp32, TF32 off for every party) | "kernelbench" (torch defaults: cuDNN TF32 on)
    degenerate: str | None = None  # why the problem cannot tell a real kernel from a trivial one (the audit); None if it can
    cost: dict | None = None  # the problem's {"flops", "bytes"} (the audit), for speed-of-light figures
    env: dict = field(default_factory=dict)
    timing: dict = field(default_factory=dict)  # candidate's rep statistics: iqr_ms, reps, ...

    def finish(self) -> "Verdict":
        """Derive correct, speedups and reward from status and times."""
        self.correct = self.status is Status.PASS
        if self.reason:
            self.reason = " ".join(str(self.reason).split())[:500]
        if self.correct and self.t_candidate_ms:
            if self.t_eager_ms:
                self.speedup_vs_eager = self.t_eager_ms / self.t_candidate_ms
            if self.t_compile_ms:
                self.speedup_vs_compile = self.t_compile_ms / self.t_candidate_ms
        self.reward = milestone_reward(self.correct, self.t_candidate_ms, self.t_eager_ms, self.t_compile_ms)
        return self

    def to_dict(self) -> dict:
        d = asdict(self)
        d["status"] = self.status.value
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    @classmethod
    def from_dict(cls, d: dict) -> "Verdict":
        known = {f.name for f in fields(cls)}
        kwargs = {k: v for k, v in d.items() if k in known}
        kwargs["status"] = Status(d["status"])
        return cls(**kwargs)


MILESTONE_GAIN = 0.05  # a milestone is a call this much shorter than the baseline's
# A speedup within EDGE_BAND (relative) of a milestone is timed in EDGE_ROUNDS rounds in all, each on fresh
# inputs, and each time is the median of its rounds': a fast call's median moves by a few percent from one
# judge to the next (where its inputs lie, the clocks: 1.8% at the median, 12% at most on the H200), and a
# reward must not flip on that alone. EvalConfig.edge_band = 0 times once.
EDGE_BAND, EDGE_ROUNDS = 0.08, 3


def milestone_reward(correct: bool, t_ms: float | None, t_eager_ms: float | None, t_compile_ms: float | None) -> int:
    """-1 if not correct; 3 if >5% faster than eager and compile; 2 if only eager; else 1 (CUDA Agent)."""
    if not correct:
        return -1
    if not t_ms or not t_eager_ms:
        return 1
    beats_eager = (t_eager_ms - t_ms) / t_eager_ms > MILESTONE_GAIN
    beats_compile = bool(t_compile_ms) and (t_compile_ms - t_ms) / t_compile_ms > MILESTONE_GAIN
    if beats_eager and beats_compile:
        return 3
    return 2 if beats_eager else 1


def near_milestone(t_ms: float | None, baseline_ms: float | None, band: float) -> bool:
    """Whether a call of t_ms lies within `band` (relative speedup) of a milestone over a baseline of
    baseline_ms: the speedup 1/(1 - MILESTONE_GAIN) = x1.053 decides between two rewards there."""
    if not t_ms or not baseline_ms:
        return False
    return abs((baseline_ms / t_ms) * (1 - MILESTONE_GAIN) - 1) < band
