"""Driver side of the Ray failure tests: run six marked jobs and kill something under them."""

from __future__ import annotations

import threading
import time
from collections import Counter
from functools import partial
from pathlib import Path
from typing import Callable

from cudagym.eval.store import Store


def run_six_jobs_killing(pool, store: Store, job: Callable, marks: Path, where: str,
                         kill: Callable[[], None]) -> tuple[Counter, dict, list[tuple], set[int]]:
    """Run jobs 0-5 on `pool` (job(i, marks, seconds, worker) touches marks/"{i}.{where it runs}" and
    returns where it ran), each result stored as a verdict; call kill() as soon as a job marks
    `where`. Returns (results per job, where each job finished, verdicts stored per problem id,
    the jobs that had started at `where`)."""
    calls, finished_at = Counter(), {}

    def kill_mid_job() -> None:
        deadline = time.time() + 60
        while time.time() < deadline and not any(p.suffix == f".{where}" for p in marks.iterdir()):
            time.sleep(0.05)
        kill()

    def record(i: int, place: str) -> None:
        calls[i] += 1
        finished_at[i] = place
        store.add_verdict("ray", {"level": 1, "problem_id": i, "name": str(i), "status": "pass"})

    killer = threading.Thread(target=kill_mid_job)
    killer.start()
    pool.run(((i, partial(job, i, str(marks), 2.0)) for i in range(6)), record, f"kill {where}")
    killer.join()
    stored = store.sql("SELECT problem_id, count(*) FROM verdicts GROUP BY problem_id ORDER BY problem_id")
    started_there = {int(p.name.split(".")[0]) for p in marks.iterdir() if p.suffix == f".{where}"}
    return calls, finished_at, stored, started_there
