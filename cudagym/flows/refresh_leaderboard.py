"""The leaderboard refresh as a Prefect flow: evaluate the submissions dropped into a watched folder
that the store has not fully evaluated (`cudagym.eval.watch`), then render the HTML page
(`cudagym.eval.leaderboard.write_html`) and publish the metrics and per-problem tables.

Each watched sub-folder is a SUBMISSION_DIR as `cudagym eval run` takes it, named after the
submission. Every verdict is stored the moment it arrives, so a failed or cancelled run resumes
where it stopped. The evaluation holds the device's slot (`devices.device_slot`).

    cudagym serve --deployments refresh_leaderboard      # nightly by default
"""

from __future__ import annotations

from pathlib import Path

from prefect import flow, get_run_logger
from prefect import task as ptask
from prefect.artifacts import (create_markdown_artifact, create_progress_artifact, create_table_artifact,
                               update_progress_artifact)
from prefect.cache_policies import NO_CACHE

from cudagym.eval.evaluate import EvalConfig
from cudagym.eval.store import Store
from cudagym.eval.watch import Selection, evaluate_submission, pending_submissions
from cudagym.flows import artifacts
from cudagym.flows.devices import default_parallel, device_slot, eval_config

DEFAULT_DB = "out/cudagym.duckdb"


@ptask(cache_policy=NO_CACHE, name="find new submissions")
def find_pending(watch_dir: str, selection: Selection, db: str, config: EvalConfig) -> list[str]:
    Path(db).parent.mkdir(parents=True, exist_ok=True)
    with Store(db) as store:
        return [str(p) for p in pending_submissions(watch_dir, selection.tasks(), store, config)]


@ptask(cache_policy=NO_CACHE, name="evaluate submission", task_run_name="evaluate {submission_dir}")
def evaluate(submission_dir: str, selection: Selection, db: str, config: EvalConfig, parallel: int) -> dict:
    with Store(db) as store:
        return evaluate_submission(submission_dir, selection, selection.tasks(), store, config, parallel)


@ptask(cache_policy=NO_CACHE, name="render leaderboard")
def render(db: str, html_out: str) -> tuple[str, list[dict], list[dict]]:
    from cudagym.eval.leaderboard import build_entries, write_html

    with Store(db) as store:
        path = write_html(store, html_out)
        entries = build_entries(store)
    return str(path), artifacts.leaderboard_rows(entries), artifacts.problem_rows(entries)


@flow(name="refresh_leaderboard", log_prints=True)
def refresh_leaderboard(watch_dir: str = "submissions", db: str = DEFAULT_DB, html_out: str = "out/leaderboard",
                        problems: str | None = None, kb_version: str = "v0.1", levels: list[int] | None = None,
                        ids: list[int] | None = None, device: str = "auto", policy: str = "strict",
                        timing_mode: str = "strict", precision: str = "strict", tolerance: str = "paper",
                        n_checks: int = 5, timeout_s: float = 60.0, parallel: int | None = None) -> dict:
    """Evaluate new submissions under `watch_dir` on KernelBench (or the task set `problems`),
    store the verdicts in `db`, write the page to `html_out`, publish the tables."""
    logger = get_run_logger()
    selection = Selection(problems, kb_version, tuple(levels) if levels else None, tuple(ids) if ids else None)
    config = eval_config(device, policy, timing_mode, precision, n_checks, timeout_s, tolerance)
    pending = find_pending(watch_dir, selection, db, config)
    logger.info("%d submission(s) to evaluate under %s", len(pending), watch_dir)
    evaluated = []
    if pending:
        progress = create_progress_artifact(0.0, key=artifacts.LEADERBOARD_PROGRESS_KEY,
                                            description=f"submissions evaluated of {len(pending)}")
        with device_slot(config.device):
            for i, path in enumerate(pending, 1):
                evaluated.append(evaluate(path, selection, db, config, parallel or default_parallel(config.device)))
                update_progress_artifact(progress, 100.0 * i / len(pending))
    page, metrics, problem_rows = render(db, html_out)
    create_table_artifact(key=artifacts.LEADERBOARD_KEY, table=metrics,
                          description="cudagym leaderboard: overall metrics per submission, timing mode and precision")
    create_table_artifact(key=artifacts.PROBLEMS_KEY, table=problem_rows,
                          description="cudagym leaderboard: every problem of every submission")
    create_markdown_artifact(key="leaderboard-refresh", markdown=artifacts.refresh_markdown(evaluated, page),
                             description="what the last refresh evaluated")
    return {"evaluated": evaluated, "page": page}


if __name__ == "__main__":
    import sys

    refresh_leaderboard(sys.argv[1] if len(sys.argv) > 1 else "submissions")
