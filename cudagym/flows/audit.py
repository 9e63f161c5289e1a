"""The degenerate-problem audit (`cudagym audit kernelbench`) as a Prefect flow: which problems'
checks accept zeros, a constant, the input or an affine map of it, and which references are random.

Rows are stored in the eval store as they arrive and reused (`batch.run_audit` with a store), so a
stopped audit resumes and a weekly rerun audits only problems whose code changed. The audit holds
the device's slot (`devices.device_slot`).

    cudagym serve --deployments audit      # weekly by default
"""

from __future__ import annotations

from pathlib import Path

from prefect import flow
from prefect import task as ptask
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE

from cudagym.eval.evaluate import EvalConfig
from cudagym.eval.store import Store
from cudagym.eval.watch import Selection
from cudagym.flows import artifacts
from cudagym.flows.devices import default_parallel, device_slot, eval_config
from cudagym.flows.refresh_leaderboard import DEFAULT_DB


@ptask(cache_policy=NO_CACHE, name="audit problems")
def audit_problems(selection: Selection, db: str, config: EvalConfig, parallel: int) -> list[dict]:
    from cudagym.eval.batch import run_audit

    Path(db).parent.mkdir(parents=True, exist_ok=True)
    with Store(db) as store:
        return run_audit(selection.tasks(), config, parallel=parallel, store=store)


@flow(name="audit", log_prints=True)
def audit(kb_version: str = "v0.1", levels: list[int] | None = None, ids: list[int] | None = None,
          problems: str | None = None, db: str = DEFAULT_DB, device: str = "auto", precision: str = "strict",
          tolerance: str = "paper", n_checks: int = 5, timeout_s: float = 60.0, parallel: int | None = None) -> dict:
    """Audit KernelBench at `kb_version` (or the task set `problems`); rows kept in `db`."""
    selection = Selection(problems, kb_version, tuple(levels) if levels else None, tuple(ids) if ids else None)
    config = eval_config(device, precision=precision, n_checks=n_checks, timeout_s=timeout_s, tolerance=tolerance)
    with device_slot(config.device):
        rows = audit_problems(selection, db, config, parallel or default_parallel(config.device))
    create_table_artifact(key=artifacts.AUDIT_KEY, table=artifacts.audit_table(rows),
                          description=artifacts.audit_summary(rows))
    create_markdown_artifact(key="kernelbench-audit-summary", markdown=artifacts.audit_summary(rows))
    return {"problems": len(rows), "degenerate": sum(bool(r.get("degenerate")) for r in rows)}
