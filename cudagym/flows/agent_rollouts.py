"""Agent rollouts as a Prefect flow: a batch of kernel-writing episodes
(`cudagym.agent.rollout.run_rollouts`) with its reward distribution in the UI.

The rollout module is imported when the flow runs, not when this module loads: `cudagym serve`
registers the deployment on any checkout, and a run on one without `cudagym.agent.rollout` fails
with one line. The batch resumes from its trajectory store (OUT/trajectories.duckdb), so the task's
retries (with backoff: LLM endpoints drop connections and rate-limit) redo only unfinished rollouts.
The API key comes from the environment (CUDAGYM_LLM_API_KEY / OPENAI_API_KEY), never from a
parameter, which the UI would show.

    cudagym serve --deployments agent_rollouts --cron agent_rollouts="0 1 * * *"   # off until scheduled
"""

from __future__ import annotations

import importlib

from prefect import flow, get_run_logger
from prefect import task as ptask
from prefect.artifacts import (create_markdown_artifact, create_progress_artifact, create_table_artifact,
                               update_progress_artifact)
from prefect.cache_policies import NO_CACHE
from prefect.states import Failed
from prefect.tasks import exponential_backoff

from cudagym.flows import artifacts
from cudagym.flows.devices import device_slot, resolve_device

ROLLOUT_MODULE = "cudagym.agent.rollout"
MISSING = "agent rollouts need cudagym.agent.rollout (the agent issue), which this checkout does not have"


class RolloutsUnavailable(RuntimeError):
    """No rollout module in this checkout."""


def import_rollout():
    """`cudagym.agent.rollout`, or RolloutsUnavailable with one line."""
    try:
        return importlib.import_module(ROLLOUT_MODULE)
    except ModuleNotFoundError as e:
        if e.name and ROLLOUT_MODULE.startswith(e.name):
            raise RolloutsUnavailable(MISSING) from None
        raise


@ptask(cache_policy=NO_CACHE, name="run rollouts", retries=2, retry_delay_seconds=exponential_backoff(backoff_factor=30),
       retry_jitter_factor=0.5)
def run_batch(config) -> dict:
    progress = RolloutProgress(create_progress_artifact(0.0, key=artifacts.ROLLOUT_PROGRESS_KEY,
                                                       description="rollouts of this batch finished"))
    return import_rollout().run_rollouts(config, progress=progress)


class RolloutProgress:
    """`run_rollouts`' progress lines, logged, and counted into the progress artifact: its first line
    says how many rollouts are to run (`artifacts.rollouts_to_run`), then one line per finished one."""

    def __init__(self, artifact_id):
        self.artifact_id, self.total, self.done = artifact_id, None, 0
        self.logger = get_run_logger()

    def __call__(self, line: str) -> None:
        self.logger.info(line)
        if self.total is None:
            self.total = artifacts.rollouts_to_run(line)
            return
        self.done += 1
        if self.total:
            update_progress_artifact(self.artifact_id, min(100.0, 100.0 * self.done / self.total))


@flow(name="agent_rollouts", log_prints=True)
def agent_rollouts(tasks: str = "kernelbench", out: str = "out/rollouts", model: str = "scripted:honest",
                   base_url: str | None = None, levels: list[int] | None = None, ids: str | None = None,
                   kb_version: str = "v0.1", n_samples: int = 1, parallel: int = 4, max_turns: int = 150,
                   device: str = "auto"):
    """Run every unfinished (task, sample) rollout of `model` (an OpenAI-compatible endpoint at
    `base_url`, or `scripted:...`) on `tasks`; trajectories and the submission folder under `out`."""
    try:
        rollout = import_rollout()
    except RolloutsUnavailable as e:
        return Failed(message=str(e))  # the run fails with this one line, no traceback
    device = resolve_device(device)
    config = rollout.RolloutConfig(tasks=tasks, out=out, model=model, base_url=base_url,
                                   levels=tuple(levels) if levels else None, ids=ids, kb_version=kb_version,
                                   n_samples=n_samples, parallel=parallel, max_turns=max_turns, device=device)
    with device_slot(device):
        summary = run_batch(config)
    create_table_artifact(key=artifacts.ROLLOUT_REWARDS_KEY, table=artifacts.reward_rows(summary),
                          description="reward distribution of the last rollout batch")
    create_markdown_artifact(key=artifacts.ROLLOUT_SUMMARY_KEY, markdown=artifacts.rollout_markdown(summary))
    return summary
