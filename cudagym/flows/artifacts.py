"""What the flows show in the Prefect UI: rows of table artifacts and markdown, built from the
library's results by plain functions (tested without Prefect), under stable keys.

Keys are lowercase letters, digits and dashes (Prefect's rule); every run of a flow adds a new
version under the same key, so the UI's Artifacts page shows the latest and its history.
"""

from __future__ import annotations

import re

DATASET_FUNNEL_KEY = "dataset-funnel"
DATASET_K_KEY = "dataset-k-distribution"
LEADERBOARD_KEY = "leaderboard-metrics"
PROBLEMS_KEY = "leaderboard-problems"
LEADERBOARD_PROGRESS_KEY = "leaderboard-progress"
AUDIT_KEY = "kernelbench-audit"
ROLLOUT_REWARDS_KEY = "rollout-rewards"
ROLLOUT_SUMMARY_KEY = "rollout-summary"
ROLLOUT_PROGRESS_KEY = "rollout-progress"

METRIC_COLUMNS = ("n", "pass_rate", "faster_than_compile_rate", "faster_than_eager_rate", "geomean_all_vs_compile",
                  "geomean_all_vs_eager", "n_degenerate_excluded")
PROBLEM_COLUMNS = ("level", "problem_id", "name", "status", "t_candidate_ms", "t_eager_ms", "t_compile_ms",
                   "speedup_vs_eager", "speedup_vs_compile", "reward", "degenerate", "reason")


def _round(value):
    return float(f"{value:.4g}") if isinstance(value, float) else value


def leaderboard_rows(entries) -> list[dict]:
    """One row per leaderboard entry (submission, timing mode, precision): its overall metrics."""
    return [{"submission": e.name, "timing_mode": e.timing_mode, "precision": e.precision,
             **{k: _round(e.metrics["overall"].get(k)) for k in METRIC_COLUMNS}} for e in entries]


def problem_rows(entries) -> list[dict]:
    """One row per (entry, problem): status, times, speedups, reward, the audit's degenerate reason."""
    return [{"submission": e.name, "timing_mode": e.timing_mode, "precision": e.precision,
             **{k: _round(getattr(row, k)) for k in PROBLEM_COLUMNS}} for e in entries for row in e.rows]


def audit_table(rows: list[dict]) -> list[dict]:
    """`audit kernelbench` rows as a table: the probes each problem's check accepts, and why it is
    degenerate (empty when its check can tell a real kernel from a trivial one)."""
    return [{"level": r.get("level"), "problem_id": r.get("problem_id"), "name": r.get("name"),
             "accepts": ", ".join(r.get("accepts") or []), "near": ", ".join(r.get("near") or []),
             "stochastic": ", ".join(r.get("stochastic") or []), "degenerate": r.get("degenerate") or "",
             "error": r.get("error") or ""} for r in rows]


def audit_summary(rows: list[dict]) -> str:
    """A markdown line or two: how many problems are degenerate, random or could not be audited."""
    degenerate = sum(bool(r.get("degenerate")) for r in rows)
    stochastic = sum(bool(r.get("stochastic")) for r in rows)
    errors = sum(bool(r.get("error")) for r in rows)
    return (f"**{degenerate} of {len(rows)}** problems accept a degenerate answer; {stochastic} references draw"
            f" random numbers; {errors} could not be audited.")


def reward_rows(summary: dict) -> list[dict]:
    """The reward distribution of a rollout batch (`run_rollouts`' summary): one row per reward,
    with its count and share, rewards in order (-1 failed, 1 correct, 2 beats eager, 3 beats compile)."""
    counts = {int(k): int(v) for k, v in (summary.get("rewards") or {}).items()}
    total = sum(counts.values())
    return [{"reward": k, "rollouts": n, "share": _round(n / total) if total else None} for k, n in sorted(counts.items())]


def rollouts_to_run(line: str) -> int | None:
    """How many rollouts a batch will run, from `run_rollouts`' first progress line
    ("N rollouts (...): F finished before, T to run, ..."); None if the line does not say."""
    match = re.search(r"(\d+) to run", line)
    return int(match.group(1)) if match else None


def rollout_markdown(summary: dict) -> str:
    """The batch in a few lines: counts, mean reward, why rollouts stopped, where the results are."""
    mean = summary.get("mean_reward")
    lines = [f"**{summary.get('finished', 0)} of {summary.get('rollouts', 0)}** rollouts finished"
             f" ({summary.get('failed', 0)} failed); mean reward {'-' if mean is None else f'{mean:.3g}'}.", "",
             "| reward | rollouts |", "|---|---|"]
    lines += [f"| {r['reward']} | {r['rollouts']} |" for r in reward_rows(summary)]
    stops = summary.get("stop_reasons") or {}
    if stops:
        lines += ["", "| stopped because | rollouts |", "|---|---|"]
        lines += [f"| {reason} | {n} |" for reason, n in sorted(stops.items(), key=lambda kv: -kv[1])]
    lines += ["", f"trajectories: `{summary.get('db', '')}`, submission: `{summary.get('submission', '')}`"]
    return "\n".join(lines)


def refresh_markdown(evaluated: list[dict], html_path: str | None) -> str:
    """What one leaderboard refresh did: the submissions it evaluated and where the page is."""
    if not evaluated:
        lines = ["No new submissions: every watched submission has its verdicts."]
    else:
        lines = ["| submission | problems | correct |", "|---|---|---|"]
        lines += [f"| {s['name']} | {s['n']} | {s['correct']} |" for s in evaluated]
    if html_path:
        lines += ["", f"page: `{html_path}`"]
    return "\n".join(lines)
