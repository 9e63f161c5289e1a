"""Decontamination: score tasks against reference problems (KernelBench L1-3) and drop copies.

Every task gets both scores' maximum over the references and the reference that attains it:
`parity` (the paper's PythonASTSimilarity on the Model class, `cudagym.dedup.parity`) and
`strong` (ours, `cudagym.dedup.strong`). A task is flagged when `parity_max > 0.9` (the paper's
rule) or `strong_max >= 0.9`. Matches are named `L{level}/{name}`, e.g. "L2/17_Conv2d_InstanceNorm_Divide".

`check_against` returns one row per task (the `cudagym dedup check --json` schema); a task whose
source does not parse gets scores 0, no matches, not flagged, and an `error`. `Decontaminate` is the
pipeline step: it drops flagged (and unparsable) tasks and records the maxima and matches of the
kept ones in their provenance (`kb_parity_max`, `kb_parity_match`, `kb_strong_max`, `kb_strong_match`).

Scores are exact (equal to scoring every pair); both indexes prune with exact upper bounds and
memoise, and large batches run on several processes.
"""

from __future__ import annotations

import ast
import dataclasses
import gc
import logging
import multiprocessing
import os
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence

from cudagym.dedup.parity import ParityIndex
from cudagym.dedup.strong import STRONG_THRESHOLD, StrongIndex, normalize
from cudagym.tasks import Task

log = logging.getLogger(__name__)

PARITY_THRESHOLD = 0.9
_PARALLEL_MIN = 2000  # tasks below which one process is faster than starting workers
_CHUNK = 500


def reference_label(task: Task) -> str:
    """How a reference is named in results: "L2/17_Conv2d_InstanceNorm_Divide" (its id without a level)."""
    return f"L{task.level}/{task.name}" if task.level is not None else task.id


class ReferenceSet:
    """Reference problems prepared once for both scores."""

    def __init__(self, references: Sequence[Task]) -> None:
        if not references:
            raise ValueError("no reference problems to check against")
        self.labels = [reference_label(t) for t in references]
        self.parity = ParityIndex([t.code for t in references])
        self.strong = StrongIndex([t.code for t in references])

    def __len__(self) -> int:
        return len(self.labels)

    def score(self, code: str) -> dict:
        """{"parity_max", "parity_match", "strong_max", "strong_match"} (+ "error" if it does not parse)."""
        try:
            tree = ast.parse(code)
            parity, p_index = self.parity.best(tree)
            strong, s_index = self.strong.best(normalize(tree))  # normalize rewrites the tree: parity first
        except (SyntaxError, ValueError, RecursionError) as e:
            where = f" at line {e.lineno}" if getattr(e, "lineno", None) else ""
            return {"parity_max": 0.0, "parity_match": None, "strong_max": 0.0, "strong_match": None,
                    "error": f"{type(e).__name__}{where}: {getattr(e, 'msg', None) or e}"}
        return {"parity_max": parity, "parity_match": None if p_index is None else self.labels[p_index],
                "strong_max": strong, "strong_match": None if s_index is None else self.labels[s_index]}


def check_against(tasks: Iterable[Task], references: Sequence[Task] | ReferenceSet,
                  parity_threshold: float = PARITY_THRESHOLD, strong_threshold: float = STRONG_THRESHOLD,
                  workers: int | None = None) -> list[dict]:
    """One row per task: {"id", "flagged", "parity_max", "parity_match", "strong_max", "strong_match"}.

    `workers`: processes to score on (default: one per CPU for 2,000 tasks or more, else one).
    Workers are forked (they inherit the reference indexes); in a threaded program pass 1.
    """
    refs = references if isinstance(references, ReferenceSet) else ReferenceSet(references)
    items = [(t.id, t.code) for t in tasks]
    if workers is None:
        workers = (os.cpu_count() or 1) if len(items) >= _PARALLEL_MIN else 1
    gc.collect()
    gc.freeze()  # the indexes are long-lived: keep them out of every collection (and shared after fork)
    try:
        if workers > 1 and len(items) > _CHUNK and "fork" in multiprocessing.get_all_start_methods():
            chunks = [items[i:i + _CHUNK] for i in range(0, len(items), _CHUNK)]
            with multiprocessing.get_context("fork").Pool(workers, initializer=_init_worker, initargs=(refs,)) as pool:
                scored = [row for rows in pool.imap(_score_chunk, chunks) for row in rows]
        else:
            scored = _score_items(refs, items)
    finally:
        gc.unfreeze()
    rows = []
    for (task_id, _), score in zip(items, scored):
        flagged = score["parity_max"] > parity_threshold or score["strong_max"] >= strong_threshold
        rows.append({"id": task_id, "flagged": flagged, **score})
    return rows


def _score_items(refs: ReferenceSet, items: list[tuple[str, str]]) -> list[dict]:
    enabled = gc.isenabled()
    gc.disable()  # ASTs are acyclic; collections would only rescan the memo tables
    try:
        return [refs.score(code) for _, code in items]
    finally:
        if enabled:
            gc.enable()


_WORKER_REFS: ReferenceSet | None = None


def _init_worker(refs: ReferenceSet) -> None:
    global _WORKER_REFS
    _WORKER_REFS = refs


def _score_chunk(items: list[tuple[str, str]]) -> list[dict]:
    return _score_items(_WORKER_REFS, items)


class Decontaminate:
    """Pipeline step: drop tasks flagged against the references; annotate the rest.

    stats: `in`, `kept`, `dropped_parity` (parity over its threshold), `dropped_strong` (only the
    strong score over its threshold), `dropped_unparsable`. `rejects(task, reason)` sees every drop.
    """

    name = "decontaminate"

    def __init__(self, references: Sequence[Task] | ReferenceSet, parity_threshold: float = PARITY_THRESHOLD,
                 strong_threshold: float = STRONG_THRESHOLD, workers: int | None = None, batch_size: int = 5000,
                 rejects: Callable[[Task, str], None] | None = None) -> None:
        self.references = references if isinstance(references, ReferenceSet) else ReferenceSet(references)
        self.parity_threshold, self.strong_threshold = parity_threshold, strong_threshold
        self.workers, self.batch_size, self.rejects = workers, batch_size, rejects
        self.stats: Counter = Counter()

    def run(self, tasks: Iterable[Task]) -> Iterator[Task]:
        batch: list[Task] = []
        for task in tasks:
            batch.append(task)
            if len(batch) >= self.batch_size:
                yield from self._run_batch(batch)
                batch = []
        if batch:
            yield from self._run_batch(batch)

    def _run_batch(self, batch: list[Task]) -> Iterator[Task]:
        rows = check_against(batch, self.references, self.parity_threshold, self.strong_threshold, self.workers)
        for task, row in zip(batch, rows):
            self.stats["in"] += 1
            reason = ("unparsable" if "error" in row else "parity" if row["parity_max"] > self.parity_threshold
                      else "strong" if row["flagged"] else None)
            if reason:
                self.stats[f"dropped_{reason}"] += 1
                log.debug("%s: dropped (%s): %s", task.id, reason, row)
                if self.rejects:
                    self.rejects(task, reason)
                continue
            self.stats["kept"] += 1
            yield dataclasses.replace(task, provenance={
                **task.provenance, "kb_parity_max": row["parity_max"], "kb_parity_match": row["parity_match"],
                "kb_strong_max": row["strong_max"], "kb_strong_match": row["strong_match"]})
