"""Training as a Prefect flow: a placeholder until the training issue lands.

`cudagym.train` holds pieces (PPO losses, value pretraining, the RFT dataset) but no end-to-end
entry point a flow could sequence yet. The deployment exists (unscheduled) so that the UI lists it
and a schedule can be set once training is in; until then a run fails at once with one line
saying why, rather than doing anything.
"""

from __future__ import annotations

from prefect import flow
from prefect.states import Failed

NOT_YET = "cudagym.train has no end-to-end training entry point yet (the training issue): this run did nothing"


@flow(name="train", log_prints=True)
def train(tasks: str = "kernelbench", out: str = "out/train", model: str = "", device: str = "auto"):
    """Train a kernel-writing policy on `tasks` (not available yet: the run fails with one line)."""
    return Failed(message=NOT_YET)  # a failed state with this message, not a traceback in the run's log
