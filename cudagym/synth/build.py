"""A dataset build: crawl, compose, dedup, decontaminate, filter, label, publish, resumable.

Each stage is a plain function over the build's DuckDB file (`BUILD/build.duckdb`); the Prefect flow
`cudagym.flows.build_dataset` wraps the same functions as tasks. Every result is stored the moment
it exists, so a killed build loses nothing and a rerun does only what is missing:

- crawl: seed operators (torch, transformers), deterministic: computed once per code and versions and kept
  in the cache folder (`crawl.on_disk`), read back by every later run;
- compose: candidates, stored with their compose order (`seq`); round r composes with seed + r;
- dedup: exact (normalised-AST hash) and near (MinHash LSH) duplicates among all candidates, the
  earliest candidate of each cluster kept: computed from the table, so it is stable across rounds;
- decontaminate: parity and strong similarity of every candidate against KernelBench L1-3, stored;
- filter: the sandboxed eager / compile / determinism / degeneracy / runtime checks (the expensive
  stage, hence last before labelling), stored per candidate;
- label: `ops` and `data_source` from the code's AST (`compose.ops_from_code`), never a composer's claim;
- publish: the first `target` kept candidates, in compose order, as `BUILD/dataset/` (parquet + card)
  and `BUILD/funnel.json`.

Rounds repeat compose..filter until `target` rows survive or `max_rounds` is reached. Stages run
in the order cheapest-first, so the filter only sees unique, uncontaminated candidates.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import platform
import sys
import threading
import time
from collections import Counter
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Mapping

import duckdb

from cudagym.synth.compose import PAPER_K_DISTRIBUTION, TRANSFORMERS_SHARE, ComposeConfig, ComposeStep, ComposeStopped
from cudagym.synth.labels import data_source_of, ops_from_code
from cudagym.synth.filter import FilterConfig, FilterResult, FilterStream, StandingJudges, run_filter, standing_judges
from cudagym.tasks import Task, TaskError, sha256_text
from cudagym.tasks.db import connect, interrupted

log = logging.getLogger(__name__)

INTERRUPTED = "interrupted (Ctrl-C): every LLM answer so far is cached; rerun the same command to resume"
STAGES = ("crawl", "compose", "dedup", "decontaminate", "filter", "label", "publish")


PROBE_MODES = ("streamed", "waves")  # BuildConfig.probes


@dataclass(frozen=True)
class BuildConfig:
    out: str
    composer: str = "programmatic"
    target: int = 200
    seed: int = 0
    device: str = "cpu"
    scale: int = 1  # multiplies every symbolic dim of composed tasks (GPU-sized tasks need more)
    # Size each candidate to the window instead (scale.ScaleSearch: its scale searched until the
    # filter's eager time lands inside); programmatic composer and scale 1 only.
    scale_search: bool = False
    max_scale: int = 128  # the search's largest scale (the composer's element bound may cap it lower)
    scale_start: int = 16  # its first probe
    # its eager timings per candidate at most: each one a wave of judges that the whole round waits
    # for. On the H200 (session 16) 228 of 230 searches ended within two probes, and the tail waves of
    # 1-2 probes cost 18-28 s each; the two searches that went on to 5 found no scale either.
    scale_probes: int = 3
    # How the search's probes reach the judges: "streamed" (one set of long-lived judges for the round's
    # search, each probe sent as its search asks, feed.JudgeFeed) or "waves" (a pass of new judges per
    # step of the searches, each waiting for the slowest probe of the step before; the only way on Ray).
    probes: str = "streamed"
    k_distribution: Mapping[int, float] = field(default_factory=lambda: dict(PAPER_K_DISTRIBUTION))
    transformers: bool = True  # crawl transformers seeds too (a core dependency)
    transformers_share: float = TRANSFORMERS_SHARE  # of the seed draws (compose.ComposeConfig)
    oversample: float = 1.1  # margin on the candidates a round filters, beyond what the yield so far predicts
    max_rounds: int = 6
    # Candidates a round composes and filters at most (None: all the target still needs). A large
    # target in one round composes thousands before filtering any, a stop while composing loses the
    # whole round, and a GPU filter times nothing until every candidate is checked: small rounds keep
    # rows coming and bound what a stop loses. Such a build needs more rounds (max_rounds).
    round_size: int | None = None
    kb_version: str = "v0.1"  # KernelBench version decontaminated against (levels 1-3)
    min_eager_ms: float | None = None  # None: the device's default window (filter.GPU_WINDOW_MS / CPU_WINDOW_MS)
    max_eager_ms: float | None = None
    task_timeout_s: float = 300.0
    parallel: int = 2
    # The GPU filter's passes: 2 (check and compile every candidate, then time the survivors), or 1
    # (each judge checks, compiles and times its tasks); None: 2 on a GPU (filter.run_filter). Since
    # session 16 a filter judge compiles outside the GPU lock, which is what made one pass slow.
    filter_passes: int | None = None
    # The two passes streamed to one set of judges, each checked task timed at once (FilterConfig.streamed);
    # None: streamed wherever two passes run on a local pool
    filter_stream: bool | None = None
    runner: str = "local"
    address: str | None = None
    llm: object | None = None  # cudagym.synth.llm.LLMConfig for composer "llm"
    # Compose the next round while this one filters (`overlapped_rounds`); None: on a GPU, where the two
    # share an otherwise idle card (on the CPU they share its cores, and gain nothing)
    overlap: bool | None = None

    @property
    def overlapped(self) -> bool:
        return self.device.startswith("cuda") if self.overlap is None else self.overlap

    def __post_init__(self):
        if self.target < 1:
            raise ValueError("target must be at least 1")
        if self.oversample < 1:
            raise ValueError("oversample must be >= 1")
        if self.max_rounds < 0 or (self.round_size is not None and self.round_size < 1):
            raise ValueError("max_rounds must be >= 0 and round_size >= 1")
        if self.probes not in PROBE_MODES:
            raise ValueError(f"probes must be one of {', '.join(PROBE_MODES)}, got {self.probes!r}")
        if self.filter_passes not in (None, 1, 2):
            raise ValueError(f"filter_passes must be 1 or 2, got {self.filter_passes}")
        self.compose_config(0)
        self.filter_config()
        if self.scale_search:
            if self.composer != "programmatic" or self.scale != 1:
                raise ValueError("the scale search sizes programmatic candidates, instead of a fixed scale: "
                                 "use --scale search with --composer programmatic")
            self.search_config()

    def compose_config(self, round_: int, n_tasks: int = 1) -> ComposeConfig:
        return ComposeConfig(composer=self.composer, n_tasks=n_tasks, k_distribution=self.k_distribution,
                             seed=self.seed * 1000 + round_, scale=self.scale, llm=self.llm,
                             transformers_share=self.transformers_share)

    def filter_config(self) -> FilterConfig:
        two_pass = None if self.filter_passes is None else self.filter_passes == 2
        return FilterConfig(device=self.device, min_eager_ms=self.min_eager_ms, max_eager_ms=self.max_eager_ms,
                            two_pass=two_pass, streamed=self.filter_stream,
                            task_timeout_s=self.task_timeout_s, parallel=self.parallel, runner=self.runner,
                            address=self.address)

    def search_config(self):
        from cudagym.synth.scale import ScaleSearch

        return ScaleSearch(self.filter_config().window_ms, max_scale=self.max_scale,
                           start=min(self.scale_start, self.max_scale), max_probes=self.scale_probes)

    def identity(self) -> dict:
        """What the stored work depends on: a rerun with other values must not mix with it. The
        scale search appears only when on, so builds made before it existed still resume."""
        # not the probe cap: it ends searches sooner or later, and every stored result stays right
        search = {"scale_search": {"max_scale": self.max_scale, "start": self.scale_start}} if self.scale_search else {}
        return {**search, "composer": self.composer, "seed": self.seed, "device": self.device, "scale": self.scale,
                "k_distribution": {str(k): v for k, v in sorted(dict(self.k_distribution).items())},
                "transformers": self.transformers, "transformers_share": self.transformers_share,
                "kb_version": self.kb_version,
                "window_ms": list(self.filter_config().window_ms),
                "model": getattr(self.llm, "model", None)}

    def command_flags(self) -> dict:
        """The flags of `cudagym dataset build` that regenerate this build (for the data card)."""
        flags = {"out": Path(self.out).name, "composer": self.composer, "target": self.target, "seed": self.seed,
                 "device": self.device,
                 "scale": "search" if self.scale_search else self.scale if self.scale != 1 else None,
                 "min_eager_ms": self.min_eager_ms, "max_eager_ms": self.max_eager_ms,
                 "kb_version": self.kb_version if self.kb_version != "v0.1" else None,
                 "no_transformers": not self.transformers,
                "transformers_share": self.transformers_share if self.transformers_share != TRANSFORMERS_SHARE else None,
                 "round_size": self.round_size, "max_rounds": self.max_rounds if self.max_rounds != 6 else None,
                 "filter_passes": self.filter_passes, "filter_stream": self.filter_stream or None,
                 "no_filter_stream": self.filter_stream is False or None,
                 "overlap": self.overlap or None, "no_overlap": self.overlap is False or None,
                 "probes": self.probes if self.scale_search and self.probes != BuildConfig.probes else None}
        if dict(self.k_distribution) != dict(PAPER_K_DISTRIBUTION):
            flags["k_distribution"] = {str(k): v for k, v in sorted(dict(self.k_distribution).items())}
        if self.scale_search:
            flags.update(max_scale=self.max_scale if self.max_scale != 128 else None,
                         scale_start=self.scale_start if self.scale_start != 16 else None,
                         scale_probes=self.scale_probes if self.scale_probes != BuildConfig.scale_probes else None)
        if self.llm is not None:
            flags["model"] = self.llm.model
        return flags


# -- the build's store ----------------------------------------------------------------------------
_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS meta (key VARCHAR PRIMARY KEY, value VARCHAR)",
    """CREATE TABLE IF NOT EXISTS candidates (seq INTEGER PRIMARY KEY, sha256 VARCHAR UNIQUE, id VARCHAR,
        name VARCHAR, code VARCHAR, provenance VARCHAR, round INTEGER, created TIMESTAMP)""",
    "CREATE TABLE IF NOT EXISTS compose_rounds (round INTEGER PRIMARY KEY, stats VARCHAR, rejects VARCHAR)",
    """CREATE TABLE IF NOT EXISTS decontam (sha256 VARCHAR PRIMARY KEY, flagged BOOLEAN, reason VARCHAR,
        parity_max DOUBLE, parity_match VARCHAR, strong_max DOUBLE, strong_match VARCHAR)""",
    """CREATE TABLE IF NOT EXISTS filtered (sha256 VARCHAR PRIMARY KEY, keep BOOLEAN, reason VARCHAR,
        detail VARCHAR, t_eager_ms DOUBLE, t_compile_ms DOUBLE, device VARCHAR, created TIMESTAMP)""",
    # a GPU filter's first pass, for candidates it passed and the second pass has not timed yet
    # where each decision's judge time went (filter.PHASES); added in session 15, so older builds get it here
    "ALTER TABLE filtered ADD COLUMN IF NOT EXISTS phases VARCHAR",
    "CREATE TABLE IF NOT EXISTS checked (sha256 VARCHAR PRIMARY KEY, measured VARCHAR, created TIMESTAMP)",
    # the scale search (--scale search): per composed candidate (its scale-1 sha256), the probes, the
    # choice or the reason there is none, and the sized task the candidates table got
    """CREATE TABLE IF NOT EXISTS sized (sha256 VARCHAR PRIMARY KEY, reason VARCHAR, scale INTEGER,
        eager_ms DOUBLE, probes VARCHAR, code VARCHAR, provenance VARCHAR, created TIMESTAMP)""",
)


class BuildStore:
    """The build's DuckDB file. One process holds it; every write commits at once. Each thread gets its
    own connection to it (a DuckDB connection is not for two threads at once): the overlapped build
    filters one round in a thread while the next one composes (`filter_beside`)."""

    def __init__(self, path: str | Path):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self._main = connect(path, "build store", option="--out")
        self._owner = threading.get_ident()
        self._cursors: dict[int, duckdb.DuckDBPyConnection] = {}
        self._cursors_lock = threading.Lock()
        for statement in _SCHEMA:
            self.db.execute(statement)
        # dedup's per-candidate work (`dedup.near.NearCache`), kept while this store is open: every round
        # dedups all the stored candidates again, and only the new ones need it
        self.near_cache = None
        # label_stage's per-candidate work, {sha256: (ops, data_source) or None for unparsable}, kept alike:
        # every loop of a streamed build labels all the kept candidates again (2 s of the main thread's ~12 s
        # between rounds at ~3,000 rows, this CPU, session 36), and a candidate's labels depend on its code only
        self.labels: dict[str, tuple[tuple[str, ...], str] | None] = {}

    @property
    def db(self) -> duckdb.DuckDBPyConnection:
        """This thread's connection: the store's own in the thread that opened it, else a cursor of it."""
        me = threading.get_ident()
        if me == self._owner:
            return self._main
        with self._cursors_lock:
            if me not in self._cursors:
                self._cursors[me] = self._main.cursor()
            return self._cursors[me]

    def close(self) -> None:
        with self._cursors_lock:
            for cursor in self._cursors.values():
                cursor.close()
            self._cursors.clear()
        self._main.close()

    def __enter__(self) -> "BuildStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def check_identity(self, identity: dict) -> None:
        """A build folder belongs to one configuration (the target may change between runs)."""
        row = self.db.execute("SELECT value FROM meta WHERE key = 'identity'").fetchone()
        if row is None:
            self.db.execute("INSERT INTO meta VALUES ('identity', ?)", [json.dumps(identity, sort_keys=True)])
            return
        old, new = json.loads(row[0]), json.loads(json.dumps(identity))  # both as JSON has them
        old.get("scale_search", {}).pop("probes", None)  # in the identity until session 16 (see identity)
        if old != new:
            diff = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
            raise TaskError(f"this build folder was made with other settings ({', '.join(diff)}); "
                            "use another --out or the same settings")

    def check_versions(self, current: dict) -> str | None:
        """Record the versions of the build's first run; a line saying what differs on a later run.
        Composing depends on them (the crawl's seeds, meta-kernel shape inference): stored candidates
        keep their code, new rounds may compose differently."""
        row = self.db.execute("SELECT value FROM meta WHERE key = 'versions'").fetchone()
        if row is None:
            self.db.execute("INSERT INTO meta VALUES ('versions', ?)", [json.dumps(current, sort_keys=True)])
            return None
        first = json.loads(row[0])
        diff = [f"{k} {first.get(k)} -> {current.get(k)}" for k in sorted(set(first) | set(current))
                if k != "cudagym" and first.get(k) != current.get(k)]
        return (f"this build was started with other versions ({', '.join(diff)}): new rounds may compose "
                "differently (the candidates stored keep their code)") if diff else None

    # candidates
    def candidates(self) -> list[tuple[int, Task]]:
        rows = self.db.execute("SELECT seq, id, name, code, provenance FROM candidates ORDER BY seq").fetchall()
        return [(seq, Task(id=id_, name=name, code=code, source="synth", provenance=json.loads(prov)))
                for seq, id_, name, code, prov in rows]

    def add_candidates(self, tasks: list[Task], round_: int) -> int:
        seq = self.db.execute("SELECT coalesce(max(seq), 0) FROM candidates").fetchone()[0]
        known = {r[0] for r in self.db.execute("SELECT sha256 FROM candidates").fetchall()}
        added = 0
        for task in tasks:
            if task.sha256 in known:
                continue
            seq += 1
            known.add(task.sha256)
            self.db.execute("INSERT INTO candidates VALUES (?, ?, ?, ?, ?, ?, ?, now())",
                            [seq, task.sha256, task.id, task.name, task.code, json.dumps(task.provenance), round_])
            added += 1
        return added

    def candidate_count(self) -> int:
        return self.db.execute("SELECT count(*) FROM candidates").fetchone()[0]

    def round_candidates(self, round_: int) -> int:
        return self.db.execute("SELECT count(*) FROM candidates WHERE round = ?", [round_]).fetchone()[0]

    def rounds(self) -> dict[int, dict]:
        return {r: {"stats": json.loads(s), "rejects": json.loads(j)}
                for r, s, j in self.db.execute("SELECT round, stats, rejects FROM compose_rounds").fetchall()}

    def add_round(self, round_: int, stats: Counter, rejects: list) -> None:
        self.db.execute("INSERT OR REPLACE INTO compose_rounds VALUES (?, ?, ?)",
                        [round_, json.dumps(dict(stats)), json.dumps(rejects[:50])])

    # per-candidate results
    def decontam(self) -> dict[str, dict]:
        cols = ("flagged", "reason", "parity_max", "parity_match", "strong_max", "strong_match")
        return {r[0]: dict(zip(cols, r[1:])) for r in self.db.execute(f"SELECT sha256, {', '.join(cols)} FROM decontam").fetchall()}

    def add_decontam(self, sha: str, row: dict, reason: str) -> None:
        self.db.execute("INSERT OR REPLACE INTO decontam VALUES (?, ?, ?, ?, ?, ?, ?)",
                        [sha, bool(reason), reason, row["parity_max"], row["parity_match"], row["strong_max"],
                         row["strong_match"]])

    def filtered(self) -> dict[str, FilterResult]:
        rows = self.db.execute("SELECT sha256, keep, reason, detail, t_eager_ms, t_compile_ms, device FROM filtered").fetchall()
        return {r[0]: FilterResult(*r[1:]) for r in rows}

    def add_filtered(self, sha: str, result: FilterResult) -> None:
        self.db.execute("INSERT OR REPLACE INTO filtered (sha256, keep, reason, detail, t_eager_ms, t_compile_ms, device,"
                        " created, phases) VALUES (?, ?, ?, ?, ?, ?, ?, now(), ?)",
                        [sha, result.keep, result.reason, result.detail, result.t_eager_ms, result.t_compile_ms,
                         result.device, json.dumps(result.phases) if result.phases else None])
        self.db.execute("DELETE FROM checked WHERE sha256 = ?", [sha])

    def checked(self) -> dict[str, dict]:
        return {sha: json.loads(m) for sha, m in self.db.execute("SELECT sha256, measured FROM checked").fetchall()}

    def add_checked(self, sha: str, measured: dict) -> None:
        self.db.execute("INSERT OR REPLACE INTO checked VALUES (?, ?, now())", [sha, json.dumps(measured)])

    def sized(self) -> dict[str, dict]:
        """{composed sha256: {reason, scale, eager_ms, probes ({scale: ms or None}), task (None: not sized)}}."""
        rows = self.db.execute("SELECT sha256, reason, scale, eager_ms, probes, code, provenance FROM sized").fetchall()
        return {sha: {"reason": reason, "scale": scale, "eager_ms": eager_ms,
                      "probes": {int(k): v for k, v in json.loads(probes).items()},
                      "task": Task(id="", name="", code=code, source="synth", provenance=json.loads(prov)) if code else None}
                for sha, reason, scale, eager_ms, probes, code, prov in rows}

    def add_sized(self, sha: str, task: Task | None, choice) -> None:
        self.db.execute("INSERT OR REPLACE INTO sized VALUES (?, ?, ?, ?, ?, ?, ?, now())",
                        [sha, choice.reason, choice.scale, choice.eager_ms,
                         json.dumps({str(k): v for k, v in sorted(choice.probes.items())}),
                         task.code if task else None, json.dumps(task.provenance) if task else None])


# -- stages -----------------------------------------------------------------------------------------
def crawl_stage(config: BuildConfig) -> tuple[list, dict]:
    """(seeds, funnel entry)."""
    from cudagym.synth.crawl import crawl_torch, crawl_transformers

    seeds, skips = crawl_torch()
    if config.transformers:
        more, more_skips = crawl_transformers()
        seeds, skips = seeds + more, skips + more_skips
    dropped = Counter(s.reason for s in skips)
    return seeds, {"stage": "crawl", "in": len(seeds) + len(skips), "kept": len(seeds), "dropped": dict(dropped),
                   "sources": dict(Counter("transformers" if s.qualified_name.startswith("transformers") else "torch" for s in seeds))}


def compose_round(seeds: list, config: BuildConfig, round_: int, n_tasks: int,
                  stop: threading.Event | None = None) -> tuple[ComposeStep, list[Task]]:
    """Round `round_`'s composed candidates (before any scale search) and the step that counted them;
    deterministic given the round and n_tasks. stop: set, the composing ends after the candidate in hand
    (a round composed ahead that the build no longer needs)."""
    step = ComposeStep(config.compose_config(round_, n_tasks), progress=lambda line: _say(f"compose round {round_}: {line}"))
    composed = []
    for task in step.run(seeds):
        if stop is not None and stop.is_set():
            break
        composed.append(task)
    return step, composed


def compose_stage(store: BuildStore, seeds: list, config: BuildConfig, round_: int, n_tasks: int,
                  judges: StandingJudges | None = None, composing: Future | None = None, feed=None) -> int:
    """Compose n_tasks candidates in round `round_` (skipped if that round is stored); new candidates added.
    judges: the build's standing judges, whose probe feed sizes them (`scale_stage`). composing: this
    round's `compose_round`, already under way on another thread (`RoundAhead`). feed: with streamed
    probes, each candidate is stored as its search ends, not with the round, and feed() is called every few
    seconds meanwhile (`streamed_rounds` sends what is stored on to the filter)."""
    if round_ in store.rounds():
        return 0
    try:
        step, composed = composing.result() if composing is not None else compose_round(seeds, config, round_, n_tasks)
        tasks = composed
        if config.scale_search:
            store_now = (lambda task: store.add_candidates([task], round_)) if feed is not None else None
            tasks = scale_stage(store, seeds, config, round_, composed, judges, on_task=store_now, tick=feed)
    except ComposeStopped as e:  # the round is not stored; what was answered is in the composer's cache
        e.progress = f"round {round_} unfinished ({e.progress})" if e.progress else f"round {round_} unfinished"
        raise
    except KeyboardInterrupt:
        raise ComposeStopped("interrupted", f"{INTERRUPTED}; round {round_} unfinished") from None
    store.add_candidates(tasks, round_)
    added = store.round_candidates(round_)  # also those stored as they were sized, or before a stop mid-round
    stats = Counter(step.stats)
    # the same code as an earlier round's candidate: dropped by the last stage before the store
    last = "scale_" if config.scale_search else ""
    if config.scale_search:
        stats.update(scale_counts(store, composed))
    stats[f"{last}dropped_duplicate"] += len(tasks) - added
    stats[f"{last}kept"] -= len(tasks) - added
    for key, value in getattr(step, "composer_stats", {}).items():
        stats[f"llm_{key}"] = value
    for key, value in versions().items():  # what this round's shapes and seeds came from
        stats[f"version_{key}"] = value
    store.add_round(round_, stats, [dataclasses.asdict(r) for r in step.rejects])
    return added


def scale_stage(store: BuildStore, seeds: list, config: BuildConfig, round_: int, composed: list[Task],
                judges: StandingJudges | None = None, on_task=None, tick=None) -> list[Task]:
    """Size the composed candidates to the window (`scale.size_chains`, probes timed by the filter's
    judges, `filter.eager_times`), each result stored as its search ends (a stopped round re-composes
    the same candidates and sizes only the rest); the sized tasks, in compose order. judges: the build's
    standing judges, whose probe feed, where it has one, times the probes. With streamed probes,
    on_task(sized task) hears each as its search ends, and tick() is called every few seconds meanwhile
    (`size_chains`)."""
    from cudagym.eval.batch import open_pool
    from cudagym.synth.filter import eager_times, streamed_probes
    from cudagym.synth.scale import ScaleChoice, size_chains

    by_id = {seed.id: seed for seed in seeds}
    done = store.sized()
    duplicates = stored_duplicates(store, [task for task in composed if task.sha256 not in done])
    for task in duplicates:
        store.add_sized(task.sha256, None, ScaleChoice(None, None, STORED_DUPLICATE))  # never probed
    if duplicates:
        _say(f"compose round {round_}: {len(duplicates)} candidates not sized, duplicates of stored ones")
    done = store.sized()
    chains = {task.sha256: [by_id[i] for i in task.provenance["seed_ids"]] for task in composed if task.sha256 not in done}
    if chains:
        filter_config = config.filter_config()
        _say(f"compose round {round_}: scale search for {len(chains)} candidates in {filter_config.window_ms} ms")
        standing = judges is not None and judges.probes is not None
        with (contextlib.nullcontext(judges.probe_pool) if standing else
              open_pool(filter_config.probe_config(), filter_config.parallel, filter_config.runner,
                        filter_config.address)) as pool:
            ended = 0

            by_sha = {task.sha256: task for task in composed}

            def on_sized(sha: str, task: Task | None, choice) -> None:  # stored as it ends, with a line now and then
                nonlocal ended
                store.add_sized(sha, task, choice)
                if task is not None and on_task is not None:
                    on_task(sized_task(by_sha[sha], {"task": task, "eager_ms": choice.eager_ms, "probes": choice.probes}))
                ended += 1
                if ended % 50 == 0 or ended == len(chains):
                    _say(f"compose round {round_}: scale search {ended} of {len(chains)} ended")

            if standing or config.probes == "streamed" and getattr(pool, "in_process", False):
                with streamed_probes(pool, filter_config, say=_say, feed=judges.probes if standing else None) as stream:
                    size_chains(chains, None, config.search_config(), config.compose_config(round_),
                                on_sized=on_sized, stream=stream, tick=tick)
            else:
                size_chains(chains, lambda tasks: eager_times(tasks, filter_config, pool, say=_say),
                            config.search_config(), config.compose_config(round_), on_sized=on_sized)
        done = store.sized()
    return [sized_task(task, done[task.sha256]) for task in composed if done[task.sha256]["task"] is not None]


def sized_task(composed: Task, found: dict) -> Task:
    """The candidate a composed one became in the scale search (`BuildStore.sized`'s entry, or one alike:
    the sized task, its eager ms and probes): the sized code, with the search's choice in the provenance."""
    provenance = {**found["task"].provenance, "scale_eager_ms": found["eager_ms"],
                  "scale_probes": {str(k): v for k, v in sorted(found["probes"].items())}}
    code = found["task"].code
    return dataclasses.replace(composed, id=f"synth/{sha256_text(code)[:12]}", code=code, provenance=provenance)


# The scale stage's drop reason (beside scale.REASONS) for a composed candidate that dedup would drop after
# sizing anyway: the same cluster as a stored candidate, which is earlier (dedup keeps the earliest)
STORED_DUPLICATE = "duplicate_of_stored"


def stored_duplicates(store: BuildStore, composed: list[Task]) -> list[Task]:
    """The composed candidates (at scale 1) in a dedup cluster with a stored candidate, in `find_duplicates`
    over the stored candidates and these: dedup keeps a cluster's earliest, so after sizing each of these
    would be dropped, its probes wasted. Sizing changes only numbers, which dedup's fingerprint does not
    see. In the H100 build of session 29, 542 of the 562 near duplicates dedup dropped had an earlier
    round's candidate in their cluster, 16% of the chains the scale search probed; the share grows with
    the build. A candidate whose cluster holds only candidates of its own round is sized, as before."""
    from cudagym.dedup.near import NearCache, find_duplicates

    if not composed:
        return []
    stored = [dataclasses.replace(task, id=f"{seq:09d}") for seq, task in store.candidates()]
    if not stored:
        return []
    new = [dataclasses.replace(task, id=f"new{i:09d}") for i, task in enumerate(composed)]  # after every stored id
    store.near_cache = store.near_cache or NearCache()
    dropped = find_duplicates(stored + new, cache=store.near_cache)
    return [task for task, renamed in zip(composed, new)
            if renamed.id in dropped and not dropped[renamed.id][0].startswith("new")]


def scale_counts(store: BuildStore, composed: list[Task]) -> Counter:
    """The scale stage's part of a round's stats (`scale_` keys): its candidates, those sized, each
    reason for the rest (scale.REASONS), and the probes timed."""
    done = store.sized()
    found = [done[task.sha256] for task in composed]
    stats = Counter({"scale_in": len(found), "scale_kept": sum(f["task"] is not None for f in found),
                     "scale_probes": sum(len(f["probes"]) for f in found)})
    stats.update(f"scale_dropped_{f['reason']}" for f in found if f["task"] is None)
    return stats


def _say(line: str) -> None:
    """A progress line on stderr (the build's stdout is its funnel table)."""
    print(line, file=sys.stderr, flush=True)


def dedup_stage(store: BuildStore) -> tuple[set[int], dict]:
    """(seqs of the kept candidates, funnel entry). The earliest candidate of each cluster is kept."""
    from cudagym.dedup.near import NearCache, find_duplicates

    candidates = store.candidates()
    by_seq = [dataclasses.replace(task, id=f"{seq:09d}") for seq, task in candidates]
    store.near_cache = store.near_cache or NearCache()
    dropped = find_duplicates(by_seq, cache=store.near_cache)
    kept = {seq for seq, _ in candidates if f"{seq:09d}" not in dropped}
    return kept, {"stage": "dedup", "in": len(candidates), "kept": len(kept),
                  "dropped": dict(Counter(reason for _, reason in dropped.values()))}


def decontaminate_stage(store: BuildStore, config: BuildConfig, seqs: set[int]) -> tuple[set[int], dict]:
    """Score the candidates not scored yet against KernelBench L1-3; (seqs not flagged, funnel entry)."""
    from cudagym.dedup.decontaminate import PARITY_THRESHOLD, check_against
    from cudagym.kernelbench import load_problems

    done = store.decontam()
    candidates = [(seq, task) for seq, task in store.candidates() if seq in seqs]
    todo = [task for _, task in candidates if task.sha256 not in done]
    if todo:
        references = load_problems(config.kb_version, [1, 2, 3])
        for task, row in zip(todo, check_against(todo, references, workers=1)):
            reason = ("unparsable" if "error" in row else "parity" if row["parity_max"] > PARITY_THRESHOLD
                      else "strong" if row["flagged"] else "")
            store.add_decontam(task.sha256, row, reason)
        done = store.decontam()
    kept = {seq for seq, task in candidates if not done[task.sha256]["flagged"]}
    dropped = Counter(done[task.sha256]["reason"] for _, task in candidates if done[task.sha256]["flagged"])
    return kept, {"stage": "decontaminate", "in": len(candidates), "kept": len(kept), "dropped": dict(dropped)}


def filter_stage(store: BuildStore, config: BuildConfig, seqs: set[int], run: int = 0,
                 judges: StandingJudges | None = None) -> tuple[set[int], dict]:
    """Filter `run` more of the candidates `seqs` (the earliest not filtered yet), then report on all
    of them: (kept seqs, funnel entry). Candidates never filtered (the target was met without them)
    count as dropped `not_needed`, so the funnel adds up."""
    done = store.filtered()
    candidates = [(seq, task) for seq, task in store.candidates() if seq in seqs]
    todo = [task for _, task in candidates if task.sha256 not in done][:run]
    if todo:  # each pass of judges says its line (filter.pass_line)
        run_filter(todo, config.filter_config(), lambda task, result: store.add_filtered(task.sha256, result),
                   checked=store.checked(), on_checked=lambda task, measured: store.add_checked(task.sha256, measured),
                   say=_say, judges=judges)
        done = store.filtered()
    kept = {seq for seq, task in candidates if task.sha256 in done and done[task.sha256].keep}
    dropped = Counter(done[task.sha256].reason if task.sha256 in done else "not_needed"
                      for seq, task in candidates if seq not in kept)
    return kept, {"stage": "filter", "in": len(candidates), "kept": len(kept), "dropped": dict(dropped)}


def label_stage(store: BuildStore, seqs: set[int]) -> tuple[list[tuple[int, Task]], dict]:
    """Tasks with `ops` and `data_source` read from their code; tasks without a recognised operator
    are dropped (`no_ops`), as are those whose code does not parse (`unparsable`)."""
    labelled, dropped = [], Counter()
    for seq, task in store.candidates():
        if seq not in seqs:
            continue
        if task.sha256 not in store.labels:
            try:
                store.labels[task.sha256] = tuple(ops_from_code(task.code)), data_source_of(task.code)
            except SyntaxError:
                store.labels[task.sha256] = None
        if store.labels[task.sha256] is None:
            dropped["unparsable"] += 1
            continue
        ops, source = store.labels[task.sha256]
        if not ops:
            dropped["no_ops"] += 1
            continue
        labelled.append((seq, dataclasses.replace(task, provenance={**task.provenance, "ops": list(ops), "data_source": source})))
    return labelled, {"stage": "label", "in": len(seqs), "kept": len(labelled), "dropped": dict(dropped)}


def dataset_rows(store: BuildStore, labelled: list[tuple[int, Task]]) -> list[dict]:
    """Rows per the contract's dataset row, in compose order, numbered from 1."""
    decontam, filtered = store.decontam(), store.filtered()
    rows = []
    for problem_id, (_, task) in enumerate(labelled, 1):
        prov, sim, measured = task.provenance, decontam[task.sha256], filtered[task.sha256]
        k = int(prov.get("k") or len(prov.get("seed_ids") or []) or 1)
        rows.append({
            "id": task.id, "name": task.name, "level": 1 if k == 1 else 2, "problem_id": problem_id, "code": task.code,
            "ops": list(prov["ops"]), "data_source": prov["data_source"], "k": k,
            "seed_ids": list(prov.get("seed_ids") or []), "seed_ops": list(prov.get("seed_ops") or []),
            "composer": prov.get("composer", ""), "model": prov.get("model") or "",
            "eager_ms": float(measured.t_eager_ms), "compile_ms": float(measured.t_compile_ms or 0.0),
            "filter_device": measured.device, "parity_max": float(sim["parity_max"]),
            "parity_match": sim["parity_match"] or "", "strong_max": float(sim["strong_max"]),
            "strong_match": sim["strong_match"] or "", "sha256": task.sha256})
    return rows


def _quantiles(values: list[float]) -> dict:
    values = sorted(values)
    if not values:
        return {"max": None, "p50": None, "p90": None, "n_over_0.9": 0}
    at = lambda q: values[min(len(values) - 1, int(q * len(values)))]  # noqa: E731
    return {"max": values[-1], "p50": at(0.5), "p90": at(0.9), "n_over_0.9": sum(v > 0.9 for v in values)}


def round_stats(store: BuildStore, prefix: str = "") -> Counter:
    """The rounds' counts whose key starts with `prefix` (removed), summed (the versions recorded beside
    them are not counts)."""
    stats = Counter()
    for info in store.rounds().values():
        stats.update({k[len(prefix):]: v for k, v in info["stats"].items()
                      if k.startswith(prefix) and isinstance(v, (int, float))})
    return stats


def funnel_entry(stage: str, stats: Counter) -> dict:
    return {"stage": stage, "in": stats["in"], "kept": stats["kept"],
            "dropped": {k[len("dropped_"):]: v for k, v in stats.items() if k.startswith("dropped_") and v}}


def compose_funnel(store: BuildStore) -> dict:
    """The compose entry of the funnel, summed over rounds."""
    return funnel_entry("compose", round_stats(store))


def scale_funnel(store: BuildStore) -> dict:
    """The scale search's entry of the funnel (--scale search), summed over rounds: a drop reason per
    scale.REASONS (and `duplicate`: sized to an earlier candidate's code), and the probes it timed."""
    stats = round_stats(store, "scale_")
    return {**funnel_entry("scale", stats), "probes": stats["probes"]}


def versions() -> dict:
    """Versions the composed code and shapes depend on (shape inference runs torch's meta kernels;
    the crawl finds what the installed torch and transformers define)."""
    import torch

    from cudagym import __version__

    try:
        import transformers

        transformers_version = transformers.__version__
    except ImportError:
        transformers_version = None
    return {"cudagym": __version__, "torch": torch.__version__, "transformers": transformers_version,
            "python": platform.python_version()}


def why_empty(stages: list[dict]) -> str:
    """One line on where the rows went: the first stage that kept nothing, and its top drop reasons."""
    for stage in stages:
        if stage["kept"] == 0:
            top = sorted(stage["dropped"].items(), key=lambda kv: -kv[1])[:4]
            reasons = ", ".join(f"{reason} {n}" for reason, n in top) or "nothing came in"
            return f"0 rows kept: {stage['stage']} kept 0 of {stage['in']} ({reasons})"
    return "0 rows kept"


def publish_stage(config: BuildConfig, rows: list[dict], stages: list[dict], stopped: tuple[str, str] | None = None) -> dict:
    """Write BUILD/funnel.json, then BUILD/dataset (parquet + card) for the first `target` rows.
    The funnel comes first and always: with 0 rows (no dataset is written then) or a stopped build
    it is the report that says what happened (`status`, `note`)."""
    published = rows[:config.target]
    stages = stages + [{"stage": "publish", "in": len(rows), "kept": len(published),
                        "dropped": {"over_target": len(rows) - len(published)} if len(rows) > len(published) else {}}]
    funnel = {
        "stages": stages,
        "k_distribution": {str(k): n for k, n in sorted(Counter(r["k"] for r in published).items())},
        "contamination": {"parity": _quantiles([r["parity_max"] for r in published]),
                          "strong": _quantiles([r["strong_max"] for r in published]),
                          "references": f"KernelBench {config.kb_version} L1-3"},
        "config": config.command_flags(),
        "versions": versions(),
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "status": "stopped" if stopped else "complete" if len(published) >= config.target else "short",
    }
    notes = [stopped[1]] if stopped else []
    if not published:
        notes.append(("0 rows kept" if stopped else why_empty(stages)) + "; no dataset written")
    elif len(published) < config.target:
        notes.append(f"{len(published)} of {config.target} rows")
    if stopped:
        funnel["stopped"] = stopped[0]
    if notes:
        funnel["note"] = "; ".join(notes)
    out = Path(config.out)
    tmp = out / "funnel.json.tmp"
    tmp.write_text(json.dumps(funnel, indent=2) + "\n")
    tmp.replace(out / "funnel.json")
    if published:
        from cudagym.synth.publish import write_hub_folder  # imports datasets: seconds, which Ctrl-C need not wait

        write_hub_folder(published, funnel, out / "dataset")
    return funnel


def reaching_filter(store: BuildStore, config: BuildConfig) -> tuple[set[int], list[dict]]:
    """The stored candidates past dedup and decontamination (their seqs), and those stages' funnel entries."""
    seqs, dedup = dedup_stage(store)
    seqs, decontam = decontaminate_stage(store, config, seqs)
    return seqs, [dedup, decontam]


def select(store: BuildStore, config: BuildConfig, filter_more: int = 0,
           reached: tuple[set[int], list[dict]] | None = None) -> tuple[list[tuple[int, Task]], list[dict]]:
    """Every stage after compose, over the stored candidates, filtering `filter_more` new ones:
    (labelled tasks in compose order, funnel entries from compose to label). reached: `reaching_filter`'s
    result, where the caller has it already."""
    seqs, entries = reached or reaching_filter(store, config)
    seqs, filtered = filter_stage(store, config, seqs, run=filter_more)
    labelled, label = label_stage(store, seqs)
    scale = [scale_funnel(store)] if config.scale_search else []
    return labelled, [compose_funnel(store), *scale, *entries, filtered, label]


def build_dataset(config: BuildConfig) -> dict:
    """Run (or resume) a build; returns its funnel. Each round composes what the target still needs
    (beyond candidates already composed and not yet filtered) and filters that many; overlapped (on a
    GPU by default), the next round composes while this one filters (`overlapped_rounds`)."""
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    with BuildStore(out / "build.duckdb") as store:
        store.check_identity(config.identity())
        changed = store.check_versions(versions())
        if changed:
            _say(f"cudagym: warning: {changed}")
        seeds, crawl = crawl_stage(config)
        labelled, stages, stopped = [], [compose_funnel(store)], None
        try:
            if config.overlapped:
                labelled, stages = overlapped_rounds(store, seeds, config)
            else:
                labelled, stages = sequential_rounds(store, seeds, config)
        except ComposeStopped as e:  # endpoint down, call cap spent, Ctrl-C while composing
            stopped = (e.reason, "; ".join(filter(None, [str(e), e.progress])))
        except (KeyboardInterrupt, RuntimeError, duckdb.Error) as e:
            if not interrupted(e):  # Ctrl-C, also when DuckDB took it mid-statement
                raise
            stopped = ("interrupted", INTERRUPTED)
        if stopped is not None:
            labelled, stages = stored_selection(store, config, labelled, stages)
        if stopped is None and len(labelled) < config.target:
            log.warning("build: %d of %d rows after %d rounds", len(labelled), config.target, config.max_rounds)
        return publish_stage(config, dataset_rows(store, labelled), [crawl] + stages, stopped)


def stored_selection(store: BuildStore, config: BuildConfig, labelled: list, stages: list[dict]) -> tuple[list, list[dict]]:
    """What a stopped build publishes: every row its store holds, the decisions of the round it stopped in
    among them (`select` over the stored decisions, filtering nothing: seconds); the given selection if
    that is stopped too. The rounds' own selection never returns from a stop: with it alone, a build stopped
    by its time limit on the H100 (session 31) published 0 of the 1,255 rows its store held."""
    try:
        return select(store, config)
    except (KeyboardInterrupt, RuntimeError, duckdb.Error) as e:
        if not interrupted(e):
            raise
        return labelled, stages


def sequential_rounds(store: BuildStore, seeds: list, config: BuildConfig) -> tuple[list[tuple[int, Task]], list[dict]]:
    """Rounds one after the other: compose what the round still needs, then filter; `select`'s result."""
    for round_ in range(config.max_rounds + 1):
        labelled, stages = select(store, config)
        missing = config.target - len(labelled)
        if missing <= 0 or round_ == config.max_rounds:
            return labelled, stages
        wanted = filter_batch(store, config, missing)
        pending = unfiltered(stages)
        if pending < wanted:
            compose_stage(store, seeds, config, next_round(store), wanted - pending)
        select(store, config, filter_more=wanted)
    raise AssertionError("unreachable")


def overlapped_rounds(store: BuildStore, seeds: list, config: BuildConfig) -> tuple[list[tuple[int, Task]], list[dict]]:
    """Rounds overlapped: while a round's candidates are filtered (in a thread of their own), the next
    round's are composed and sized, so a round takes the longer of the two, not their sum. On the H100
    (session 29) a round's composing and scale search took 54-70 s, then its check and timing passes
    74-106 s, one after the other, and the GPU was busy in fewer than half the samples. The filter
    gets what is composed and not yet filtered (at most what the target still needs); a round composes
    first only when nothing is waiting to be filtered (the first round). Each round composes enough
    for the round after it: the rows the filter now running will likely not give, at the filter's
    yield so far, and at the share of composed candidates that reach the filter (scale search, dedup,
    decontamination). `select`'s result."""
    labelled, stages = select(store, config)
    if len(labelled) >= config.target:  # nothing to do: no standing judges started for it
        return labelled, stages
    with build_judges(config) as judges, \
            ThreadPoolExecutor(max_workers=1, thread_name_prefix="cudagym-filter") as filter_thread:
        if judges is not None and judges.checks is not None:
            return streamed_rounds(store, seeds, config, judges, filter_thread)
        for round_ in range(config.max_rounds):
            missing = config.target - len(labelled)
            if missing <= 0:
                break
            first = compose_first(store, config, stages, missing)
            if first:
                compose_stage(store, seeds, config, next_round(store), first, judges)
                labelled, stages = select(store, config)
            batch, ahead = round_plan(store, config, stages, missing, last=round_ + 1 == config.max_rounds)
            if batch:
                compose_next = (lambda: compose_stage(store, seeds, config, next_round(store), ahead, judges)) if ahead else None
                filter_beside(store, config, batch, compose_next, filter_thread, judges)
            labelled, stages = select(store, config)
    return labelled, stages


def streamed_rounds(store: BuildStore, seeds: list, config: BuildConfig, judges: StandingJudges,
                    filter_thread: ThreadPoolExecutor) -> tuple[list[tuple[int, Task]], list[dict]]:
    """Overlapped rounds without a barrier between them, where the filter streams to standing judges:
    one `filter.FilterStream` serves the whole build (its answers stored on `filter_thread`), each round's
    candidates go into it the moment the round has composed and sized them, and the next round composes
    at once, while the filter works through what it has (at most `stream_backlog` candidates ahead of
    it). With a barrier, each round waited for the slower of its filter and the next round's sizing, and
    both end in a tail: on the H100 (session 33) a round's checks were half done 5-10 s in and its last
    timing 35-50 s in, its probes half done at 16-25 s and the last at 37-45 s; the GPU was busy in 16 of
    27 samples. A round composes what the missing rows need beyond the candidates waiting and in flight
    (at the filter's yield and the composing's survival so far); once enough are in flight, the build
    waits for their decisions instead. On the H100 (session 34) it kept the barrier's rate (37.9 per
    GPU-minute against 41.0), its first decision at once: the judges' waits for the GPU lock and the
    memory budget, not the barrier, hold it. `select`'s result."""
    filter_config = config.filter_config()
    ahead = RoundAhead(seeds, config)
    stream = FilterStream(judges.checks, judges.check_pool.worker.env, filter_config,
                          on_result=lambda task, result: store.add_filtered(task.sha256, result),
                          checked=store.checked(), on_checked=lambda task, measured: store.add_checked(task.sha256, measured),
                          say=_say)
    serving = filter_thread.submit(stream.serve)
    rounds = 0

    def fill() -> tuple:
        """Send the filter what the missing rows need, beyond what it already has: (labelled, stages,
        missing rows, the filter's yield, candidates waiting, room the filter had for them)."""
        reached = reaching_filter(store, config)
        labelled, stages = select(store, config, reached=reached)
        missing = config.target - len(labelled)
        rate = filter_rate(store)
        waiting = waiting_candidates(store, reached[0], stages, stream)
        room = filter_batch(store, config, math.ceil(max(0.0, missing - stream.outstanding * rate)))
        stream.add(waiting[:room])
        return labelled, stages, missing, rate, waiting, room

    filled = {"at": time.monotonic(), "stored": 0}

    def feed() -> None:
        """During a round's scale search: the candidates sized so far go on to the filter, at most every
        FEED_S, instead of all at the round's end. A round's filter work used to start with its slowest
        search's end, then compile before it held the GPU: on the H200 (session 35) the GPU lock stood
        idle 10-25 s of each ~40-s round."""
        if time.monotonic() - filled["at"] < FEED_S:  # before the count: the searches call this at every end
            return
        stored = store.candidate_count()
        if stored == filled["stored"]:
            return
        filled["at"], filled["stored"] = time.monotonic(), stored
        fill()

    try:
        while True:
            labelled, stages, missing, rate, waiting, room = fill()
            if missing <= 0 and not stream.outstanding:
                break
            short = missing - stream.outstanding * rate - max(0, len(waiting) - room) * rate
            if rounds >= config.max_rounds or short <= 0:  # nothing more to compose: wait for the decisions
                if not stream.outstanding:
                    break
                # candidates still waiting beyond a batch (a resumed backlog) go in as the filter makes room, at
                # least one decision later; with none waiting, or enough in flight for the missing rows, all of them
                level = min(stream_backlog(config), stream.outstanding - 1) if len(waiting) > room > 0 else 0
                _wait_for(stream, serving, lambda: stream.outstanding <= level)
            else:
                # at most a backlog's worth ahead of the filter: a stop loses the candidates in flight's work
                _wait_for(stream, serving, lambda: stream.outstanding <= stream_backlog(config))
                round_ = next_round(store)
                n, composing = ahead.take(round_)
                if composing is None:
                    n = compose_count(config, stages, filter_batch(store, config, math.ceil(short)), fresh_share(store))
                    if rounds == 0 and not stream.outstanding:  # the filter idles until this round is sized: a third
                        n = math.ceil(n / 3)  # of a round reaches it sooner (a call's start: on the H100 53 s to the first decision)
                # the round after this one composes while this one is sized, for what would then still be short
                short_next = short - n * compose_survival(stages) * rate
                if rounds + 1 < config.max_rounds and short_next > 0:
                    ahead.start(round_ + 1, compose_count(config, stages, filter_batch(store, config, math.ceil(short_next)),
                                                          fresh_share(store)))
                compose_stage(store, seeds, config, round_, n, judges, composing=composing, feed=feed)
                rounds += 1
                stream.report()  # the filter's lines since the round before: a pair a round
        stream.close()
        serving.result()
        stream.report()
    except ComposeStopped as e:
        stream.close()
        if e.reason != "interrupted":
            _finish(serving)
        else:
            _stop(serving)
        stream.report(stopped=e.reason == "interrupted")
        raise
    except BaseException:
        stream.close()
        _stop(serving)
        stream.report(stopped=True)
        raise
    finally:
        ahead.close()
    return select(store, config)


class RoundAhead:
    """The next round's composing (`compose_round`) on a thread of its own, started as this round's scale
    search begins: the search waits on the judges' probes, while the composing, part of the main thread's
    work between two rounds, left the probe judges idle (~1.6 s a round of 150 on a 2-core CPU, more on a
    GPU box whose cores the judges' compiles load). The programmatic composer only: the llm composer waits on its
    endpoint with its own concurrency, and its stops (endpoint down, call cap) belong to the round that
    asked. A round composed ahead is deterministic (`compose_round`), so one the build no longer needs
    (the target met, a stop) is dropped and nothing is lost."""

    def __init__(self, seeds: list, config: BuildConfig):
        self.seeds, self.config = seeds, config
        self.thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="cudagym-compose") \
            if config.composer == "programmatic" else None
        self.stop = threading.Event()
        self.round: int | None = None
        self.n = 0
        self.future: Future | None = None

    def start(self, round_: int, n_tasks: int) -> None:
        if self.thread is not None and n_tasks > 0:
            self.round, self.n = round_, n_tasks
            self.future = self.thread.submit(compose_round, self.seeds, self.config, round_, n_tasks, self.stop)

    def take(self, round_: int) -> tuple[int, Future | None]:
        """(n_tasks, its future) if round `round_` was started ahead, else (0, None); either way, forgotten."""
        taken = (self.n, self.future) if self.future is not None and self.round == round_ else (0, None)
        self.round, self.n, self.future = None, 0, None
        return taken

    def close(self) -> None:
        self.stop.set()  # a round under way ends after its candidate in hand; none waits for it
        if self.thread is not None:
            self.thread.shutdown(wait=False, cancel_futures=True)


FEED_S = 3.0  # a streamed build sends a round's sized candidates to the filter this often (`streamed_rounds`)


def stream_backlog(config: BuildConfig) -> int:
    """Candidates a streamed build lets wait in the filter (added, not yet decided) before it composes
    the next round: a round's worth of what reaches the filter (about half a round of 150 on the H100,
    session 33), enough to keep the judges busy while the next round composes and sizes."""
    return max(2 * config.parallel, (config.round_size or 150) // 2)


def waiting_candidates(store: BuildStore, seqs: set[int], stages: list[dict], stream: FilterStream) -> list[Task]:
    """The candidates past dedup and decontamination (`seqs`, `reaching_filter`) that the filter has not
    decided and that are not in the stream, in compose order."""
    if not unfiltered(stages):
        return []
    done = store.filtered()
    return [task for seq, task in store.candidates()
            if seq in seqs and task.sha256 not in done and task.sha256 not in stream]


def _wait_for(stream: FilterStream, serving: Future, ready) -> None:
    """Wait until ready() holds; the stream's serving thread failing (its judges stopped) raises its error."""
    while not stream.wait_until(lambda: ready() or serving.done(), timeout_s=1.0):
        pass
    if serving.done() and not ready():
        serving.result()  # raises what ended it
        raise RuntimeError("the filter stream ended with candidates still in flight")


def build_judges(config: BuildConfig):
    """The overlapped build's standing judges (`filter.standing_judges`), for what would otherwise start
    judges of its own each round: the scale search's streamed probes, the filter's streamed passes (GPU
    defaults, on this machine's pool). Nothing (a null context) where neither streams."""
    filter_config = config.filter_config()
    local = filter_config.runner == "local"
    probes = config.scale_search and config.probes == "streamed" and local
    if not (probes or filter_config.streams):
        return contextlib.nullcontext()
    return standing_judges(filter_config, probes=probes, checks=filter_config.streams)


def compose_first(store: BuildStore, config: BuildConfig, stages: list[dict], missing: int) -> int:
    """Candidates an overlapped round composes before it filters: none while some wait to be filtered
    (those are filtered while the round composes), else a filter batch's worth at the survival so far."""
    return 0 if unfiltered(stages) else compose_count(config, stages, filter_batch(store, config, missing), fresh_share(store))


def round_plan(store: BuildStore, config: BuildConfig, stages: list[dict], missing: int, last: bool) -> tuple[int, int]:
    """An overlapped round: (candidates it filters, candidates it composes meanwhile for the next round;
    none in the build's last round)."""
    batch = min(filter_batch(store, config, missing), unfiltered(stages))
    return batch, 0 if last or not batch else compose_ahead(store, config, stages, missing, batch)


def filter_beside(store: BuildStore, config: BuildConfig, run: int, work, filter_thread: ThreadPoolExecutor,
                  judges: StandingJudges | None = None) -> None:
    """Filter `run` more candidates on `filter_thread` while work() (the next round's composing), if
    any, runs in this thread; return when both are done. Ctrl-C, or work() failing, stops the filter's
    judges (what they finished is stored); a composer that stopped for its endpoint or call cap lets
    the filter finish first."""
    seqs, _ = reaching_filter(store, config)
    filtering = filter_thread.submit(filter_stage, store, config, seqs, run, judges)
    try:
        if work is not None:
            work()
        filtering.result()
    except ComposeStopped as e:
        if e.reason != "interrupted":
            _finish(filtering)
        else:
            _stop(filtering)
        raise
    except BaseException:
        _stop(filtering)
        raise


def _finish(filtering: Future) -> None:
    try:
        filtering.result()
    except BaseException:
        _stop(filtering)
        raise


def _stop(filtering: Future) -> None:
    """Stop the filter's judges until its thread returns (it may be between passes, and a pass that
    starts after a stop starts judges of its own), then log the filter's error unless it is the stop's
    own Interrupted; the caller raises its own error. A stop of every judge of the process: this thread's
    scale search, if any, has already ended."""
    from cudagym.eval.evaluate import Interrupted, clear_stop, stop_live_judges

    while not filtering.done():
        stop_live_judges()
        wait([filtering], timeout=1.0)
    clear_stop()
    error = filtering.exception()
    if error is not None and not isinstance(error, Interrupted):
        log.warning("the filter beside the composing failed: %s: %s", type(error).__name__, error)


def filter_rate(store: BuildStore) -> float:
    """The filter's yield so far (0.85 until 20 are measured)."""
    results = list(store.filtered().values())
    kept = sum(r.keep for r in results)
    return kept / len(results) if len(results) >= 20 else 0.85


def filter_batch(store: BuildStore, config: BuildConfig, missing: int) -> int:
    """How many candidates the next round filters: enough for the missing rows at the filter's
    yield so far, times the margin. The filter is the expensive stage: filtering a fixed multiple
    would waste most of a round on rows the target does not need."""
    wanted = math.ceil(missing / max(filter_rate(store), 0.05) * config.oversample)
    return min(wanted, config.round_size) if config.round_size else wanted


def compose_survival(stages: list[dict]) -> float:
    """The share of composed candidates that reached the filter so far (past the scale search, dedup
    and decontamination), from `select`'s funnel entries; 1 until 20 were composed. On the H100
    (session 29) 0.48: 1,055 of 3,284 too fast at every scale, 562 near duplicates."""
    by_stage = {s["stage"]: s for s in stages}
    composed = by_stage["compose"]["kept"]
    return max(by_stage["decontaminate"]["kept"] / composed, 0.1) if composed >= 20 else 1.0


def compose_count(config: BuildConfig, stages: list[dict], wanted: int, fresh: float = 1.0) -> int:
    """Candidates to compose for `wanted` more to reach the filter, at the survival so far. The round's
    cap counts the candidates it sizes: `fresh` is the share of a round's composed candidates that are
    not duplicates of stored ones (`fresh_share`), and those cost a compose, no probe."""
    n = math.ceil(wanted / compose_survival(stages))
    return min(n, math.ceil(config.round_size / fresh)) if config.round_size else n


FRESH_ROUNDS = 3  # the rounds `fresh_share` reads: the composer's repeats grow with the build, so the recent ones


def fresh_share(store: BuildStore) -> float:
    """The share of the last FRESH_ROUNDS rounds' composed candidates that were not duplicates of stored
    ones (`stored_duplicates`, dropped before the scale search); 1 before any, at least 0.25 (a round then
    composes at most four times round_size). As the build grows, the composer repeats more of what it
    made before: on the H200 (session 35, ~4,400 candidates stored) 29-75 of each round of 150, so a
    round sized 29-36 candidates in 18-33 s, and the judges idled between rounds (the GPU lock was free
    in 29% of the call) while the next one composed."""
    rounds = store.rounds()
    last = [rounds[r]["stats"] for r in sorted(rounds)[-FRESH_ROUNDS:]]
    composed = sum(stats.get("scale_in", 0) for stats in last)
    repeats = sum(stats.get(f"scale_dropped_{STORED_DUPLICATE}", 0) for stats in last)
    return max(0.25, 1 - repeats / composed) if composed else 1.0


def compose_ahead(store: BuildStore, config: BuildConfig, stages: list[dict], missing: int, batch: int) -> int:
    """Candidates to compose while `batch` of the waiting ones are filtered: the round after needs the
    rows this batch will likely not give, beyond the candidates that will still be waiting."""
    rest = missing - batch * filter_rate(store)
    if rest <= 0:
        return 0
    need = filter_batch(store, config, math.ceil(rest)) - (unfiltered(stages) - batch)
    return compose_count(config, stages, need, fresh_share(store)) if need > 0 else 0


def unfiltered(stages: list[dict]) -> int:
    """Candidates past dedup and decontamination that the filter has not seen yet, from `select`'s
    funnel entries (the filter stage counts them as `not_needed`)."""
    return next(s for s in stages if s["stage"] == "filter")["dropped"].get("not_needed", 0)


def next_round(store: BuildStore) -> int:
    rounds = store.rounds()
    return max(rounds) + 1 if rounds else 0
