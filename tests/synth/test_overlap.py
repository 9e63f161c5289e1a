"""The overlapped build (on a GPU by default): the next round composes while this one filters."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import duckdb
import pytest

from cudagym.eval import evaluate
from cudagym.synth.build import (BuildConfig, BuildStore, build_dataset, compose_ahead, compose_count, compose_stage,
                                 compose_survival, crawl_stage, filter_beside, fresh_share, select)
from cudagym.synth.filter import FilterResult
from cudagym.synth.publish import build_command, read_build_rows
from cudagym.tasks import Task

HANGS = '''import time
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        time.sleep(600)
        return torch.tanh(x) * 3.0 + x


def get_inputs():
    return [torch.randn(64, 64)]


def get_init_inputs():
    return []
'''


def _config(out, **kw) -> BuildConfig:
    return BuildConfig(out=str(out), target=kw.pop("target", 6), seed=5, transformers=False, parallel=2, **kw)


def _stages(composed: int, reached: int, unfiltered: int) -> list[dict]:
    """`select`'s funnel entries, as far as the planner reads them."""
    return [{"stage": "compose", "in": composed, "kept": composed, "dropped": {}},
            {"stage": "dedup", "in": composed, "kept": reached, "dropped": {}},
            {"stage": "decontaminate", "in": reached, "kept": reached, "dropped": {}},
            {"stage": "filter", "in": reached, "kept": 0, "dropped": {"not_needed": unfiltered}}]


def _store_with_yield(path, kept: int, dropped: int) -> BuildStore:
    store = BuildStore(path)
    for i in range(kept + dropped):
        store.add_filtered(f"{i:064d}", FilterResult(i < kept, "" if i < kept else "too_fast", "", 2.0, 1.0, "cpu"))
    return store


def test_the_planner_composes_for_the_next_round_at_the_survival_so_far(tmp_path):
    # 200 composed, 100 reached the filter: half survive, so twice what the filter needs is composed
    assert compose_survival(_stages(200, 100, 0)) == 0.5
    assert compose_survival(_stages(10, 1, 0)) == 1.0  # too few composed to tell
    assert compose_count(_config(tmp_path), _stages(200, 100, 0), 30) == 60
    assert compose_count(_config(tmp_path, round_size=40), _stages(200, 100, 0), 30) == 40
    # a round's cap counts what it sizes: with half its candidates repeats of stored ones, twice round_size
    assert compose_count(_config(tmp_path, round_size=40), _stages(200, 100, 0), 50, fresh=0.5) == 80
    with _store_with_yield(tmp_path / "build.duckdb", kept=15, dropped=5) as store:  # yield 0.75
        # 30 rows missing, 20 filtered now (15 rows likely): 15 more rows need 15 / 0.75 x 1.1 = 22 filtered
        # next round, 10 of them still waiting after this batch, so 12 to reach the filter: 24 composed
        assert compose_ahead(store, _config(tmp_path), _stages(200, 100, 30), missing=30, batch=20) == 24
        # what is waiting already covers it, or this batch likely gives every missing row: nothing
        assert compose_ahead(store, _config(tmp_path), _stages(200, 100, 60), missing=30, batch=20) == 0
        assert compose_ahead(store, _config(tmp_path), _stages(200, 100, 40), missing=12, batch=40) == 0


def test_the_fresh_share_is_the_last_rounds_candidates_that_were_not_repeats_of_stored_ones(tmp_path):
    from collections import Counter

    with BuildStore(tmp_path / "build.duckdb") as store:
        assert fresh_share(store) == 1.0  # no round yet
        store.add_round(0, Counter(scale_in=150, scale_dropped_duplicate_of_stored=0), [])  # older than the last three
        for round_, repeats in ((1, 60), (2, 75), (3, 90)):
            store.add_round(round_, Counter(scale_in=150, scale_dropped_duplicate_of_stored=repeats), [])
        assert fresh_share(store) == pytest.approx(1 - 225 / 450)
        # the planner composes past round_size by as much
        stages = _stages(600, 200, 0)
        assert compose_ahead(store, _config(tmp_path, round_size=40), stages, missing=100, batch=0) == 80
        for round_ in (4, 5):
            store.add_round(round_, Counter(scale_in=150, scale_dropped_duplicate_of_stored=150), [])
        assert fresh_share(store) == 0.25  # 60 of 450 fresh, but never more than four times round_size


def test_the_store_takes_writes_from_several_threads_at_once(tmp_path):
    with BuildStore(tmp_path / "build.duckdb") as store:
        def write(t: int) -> int:
            for i in range(25):
                store.add_filtered(f"{t}{i:063d}", FilterResult(True, "", "", 1.0, 1.0, "cpu"))
                store.add_checked(f"{t}{i:063d}x", {"stage": "checked"})
            return len(store.filtered())

        with ThreadPoolExecutor(4) as pool:
            seen = list(pool.map(write, range(4)))
        assert all(25 <= n <= 100 for n in seen)
        assert len(store.filtered()) == 100 and len(store.checked()) == 100
    db = duckdb.connect(str(tmp_path / "build.duckdb"), read_only=True)  # closed, every connection: it opens again
    assert db.execute("SELECT count(*) FROM filtered").fetchone()[0] == 100
    db.close()


@pytest.mark.slow
def test_the_filter_runs_while_the_next_round_composes(tmp_path, kernelbench_path):
    """filter_beside: the batch's results reach the store while the work still runs (the work waits for
    them: run one after the other, it would wait forever), and the work's round is stored too."""
    config = _config(tmp_path)
    seeds, _ = crawl_stage(config)
    with BuildStore(tmp_path / "build.duckdb") as store:
        compose_stage(store, seeds, config, 0, 4)
        _, stages = select(store, config)
        batch = next(s for s in stages if s["stage"] == "filter")["dropped"]["not_needed"]
        seen = []

        def compose_next() -> None:
            deadline = time.monotonic() + 300
            while not store.filtered() and time.monotonic() < deadline:
                time.sleep(0.2)
            seen.append(len(store.filtered()))
            compose_stage(store, seeds, config, 1, 3)

        with ThreadPoolExecutor(1) as thread:
            filter_beside(store, config, batch, compose_next, thread)
        assert seen[0] >= 1  # a result while composing
        assert len(store.filtered()) == batch >= 3
        assert sorted(store.rounds()) == [0, 1]
        assert {r for r, in store.db.execute("SELECT DISTINCT round FROM candidates").fetchall()} == {0, 1}


@pytest.mark.slow
@pytest.mark.parametrize("filter_flags", [{}, {"filter_passes": 2, "filter_stream": True}], ids=["passes", "streamed"])
def test_ctrl_c_while_composing_stops_the_filter_and_keeps_what_it_finished(tmp_path, kernelbench_path, filter_flags):
    """Ctrl-C lands in the composing thread while a candidate that hangs is filtered (by a pass of judges,
    or by the streamed passes' feed): the filter's judges are stopped at once (no 600 s wait, no judge
    left), the hanging candidate gets no verdict (stopped, not failed), and the build resumed with the
    same command finishes."""
    config = _config(tmp_path, target=2, **filter_flags)
    seeds, _ = crawl_stage(config)
    with BuildStore(tmp_path / "build.duckdb") as store:
        store.add_candidates([Task(id="synth/hangs", name="hangs", code=HANGS, source="synth",
                                   provenance={"seed_ids": [], "k": 1})], 0)
        store.add_round(0, {"in": 1, "kept": 1}, [])
        hang_sha = store.candidates()[0][1].sha256

        def interrupted_compose() -> None:
            deadline = time.monotonic() + 120
            while not evaluate._LIVE_JUDGES and time.monotonic() < deadline:
                time.sleep(0.1)
            assert evaluate._LIVE_JUDGES, "no filter judge started"
            time.sleep(3)  # the judge is in the hanging forward
            raise KeyboardInterrupt

        t0 = time.monotonic()
        with pytest.raises(KeyboardInterrupt), ThreadPoolExecutor(1) as thread:
            filter_beside(store, config, 1, interrupted_compose, thread)
        assert time.monotonic() - t0 < 150
        assert not evaluate._LIVE_JUDGES
        assert hang_sha not in store.filtered()
        assert not [t for t in threading.enumerate() if t.name.startswith("cudagym-filter")]
    # the next run filters the rest (the hanging candidate times out then: a 20 s budget here)
    funnel = build_dataset(_config(tmp_path, target=2, overlap=True, task_timeout_s=20.0, **filter_flags))
    assert funnel["status"] == "complete" and len(read_build_rows(tmp_path / "dataset")) == 2
    with BuildStore(tmp_path / "build.duckdb") as store:
        assert store.filtered()[hang_sha].reason == "timeout"


@pytest.mark.slow
@pytest.mark.parametrize("overlap,flags", [(True, {}), (False, {}), (True, {"filter_passes": 2, "filter_stream": True})],
                         ids=["overlapped", "sequential", "standing-judges"])
def test_a_build_stopped_mid_round_publishes_every_row_its_store_holds(tmp_path, kernelbench_path, overlap, flags):
    """A build resumed with rows stored, then stopped by a real SIGINT (Ctrl-C, a time limit's `timeout
    -s INT`) while its round filters a candidate that hangs: it publishes the rows its store holds, with
    the whole funnel, not the empty selection its unfinished round began with (on the H100 in session 31
    a stopped overlapped build published 0 of its 1,255 stored rows). With streamed passes the build's
    standing judges are stopped with it: no judge and no feed thread left."""
    import os
    import signal

    assert build_dataset(_config(tmp_path, target=2, overlap=overlap, **flags))["status"] == "complete"
    with BuildStore(tmp_path / "build.duckdb") as store:
        stored = len(select(store, _config(tmp_path, target=2, overlap=overlap, **flags))[0])  # a round may keep more than asked
        store.add_candidates([Task(id="synth/hangs", name="hangs", code=HANGS, source="synth",
                                   provenance={"seed_ids": [], "k": 1})], max(store.rounds()) + 1)

    def ctrl_c_once_a_judge_runs() -> None:
        deadline = time.monotonic() + 120
        while not evaluate._LIVE_JUDGES and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(3)
        os.kill(os.getpid(), signal.SIGINT)  # a real signal: it wakes the waiting main thread

    watcher = threading.Thread(target=ctrl_c_once_a_judge_runs, daemon=True)
    watcher.start()
    funnel = build_dataset(_config(tmp_path, target=stored + 1, overlap=overlap, **flags))
    watcher.join(5)
    assert funnel.get("stopped") == "interrupted" and "0 rows kept" not in funnel["note"], funnel
    stages = {s["stage"]: s for s in funnel["stages"]}
    assert {"dedup", "filter", "label", "publish"} <= set(stages), list(stages)
    assert stages["publish"]["kept"] == stored >= 2 and stages["filter"]["kept"] == stored
    assert len(read_build_rows(tmp_path / "dataset")) == stored
    assert not evaluate._LIVE_JUDGES
    assert not [t for t in threading.enumerate() if t.name.startswith("fed-judge")]


@pytest.mark.slow
def test_an_overlapped_build_publishes_what_a_sequential_one_would(tmp_path, kernelbench_path):
    """--overlap on the CPU, in rounds of 4 for 6 rows: the funnel adds up, the target is met, a later
    round's candidates were composed before the filter of the round before had ended, and a rerun does
    nothing again."""
    funnel = build_dataset(_config(tmp_path, overlap=True, round_size=4))
    stages = {s["stage"]: s for s in funnel["stages"]}
    for stage in funnel["stages"]:
        assert stage["in"] == stage["kept"] + sum(stage["dropped"].values()), stage
    assert stages["publish"]["kept"] == 6 and funnel["status"] == "complete"
    assert funnel["config"]["overlap"] is True and "--overlap" in build_command(funnel["config"])
    db = duckdb.connect(str(tmp_path / "build.duckdb"), read_only=True)
    rounds = db.execute("SELECT round, min(c.created), max(f.created) FROM candidates c "
                        "LEFT JOIN filtered f USING (sha256) GROUP BY round ORDER BY round").fetchall()
    counts = db.execute("SELECT (SELECT count(*) FROM candidates), (SELECT count(*) FROM filtered)").fetchone()
    db.close()
    assert len(rounds) >= 2, rounds
    # round r+1 was composed while round r's candidates were being filtered
    assert any(later[1] < earlier[2] for earlier, later in zip(rounds, rounds[1:]) if earlier[2]), rounds
    again = build_dataset(_config(tmp_path, overlap=True, round_size=4))
    assert again["stages"] == funnel["stages"]
    db = duckdb.connect(str(tmp_path / "build.duckdb"), read_only=True)
    assert db.execute("SELECT (SELECT count(*) FROM candidates), (SELECT count(*) FROM filtered)").fetchone() == counts
    db.close()


def test_the_overlap_is_on_a_gpu_by_default_and_the_card_says_when_it_was_set(tmp_path):
    assert BuildConfig(out=str(tmp_path), device="cuda").overlapped
    assert not BuildConfig(out=str(tmp_path), device="cpu").overlapped
    assert BuildConfig(out=str(tmp_path), device="cpu", overlap=True).overlapped
    assert not BuildConfig(out=str(tmp_path), device="cuda", overlap=False).overlapped
    assert "--no-overlap" in build_command(BuildConfig(out=str(tmp_path), device="cuda", overlap=False).command_flags())
    assert "overlap" not in build_command(BuildConfig(out="build", device="cuda").command_flags())
    # the filter's streamed passes likewise: the default unless turned off, which the card then says
    assert "filter-stream" not in build_command(BuildConfig(out="build", device="cuda").command_flags())
    assert BuildConfig(out="build", device="cuda").filter_config().streamed is None
    assert BuildConfig(out="build", device="cuda", filter_stream=False).filter_config().streamed is False


@pytest.mark.slow
def test_the_prefect_flow_overlaps_its_rounds_too(tmp_path, kernelbench_path, prefect_harness):
    from cudagym.flows.build_dataset import build_dataset as build_flow

    funnel = build_flow(_config(tmp_path, overlap=True, round_size=4))
    assert funnel["status"] == "complete" and len(read_build_rows(tmp_path / "dataset")) == 6
    db = duckdb.connect(str(tmp_path / "build.duckdb"), read_only=True)
    rounds = db.execute("SELECT round, min(c.created), max(f.created) FROM candidates c "
                        "LEFT JOIN filtered f USING (sha256) GROUP BY round ORDER BY round").fetchall()
    db.close()
    assert any(later[1] < earlier[2] for earlier, later in zip(rounds, rounds[1:]) if earlier[2]), rounds


def test_a_composed_candidate_in_a_stored_ones_cluster_is_never_probed(tmp_path):
    """The scale search skips a composed candidate that dedup would drop after sizing (the same cluster as a
    stored candidate: here the stored one at another size); it is stored with its reason and counted in
    the scale stage's drops, and no judge starts for it. An unrelated candidate is not taken for one."""
    from cudagym.synth.build import STORED_DUPLICATE, scale_counts, scale_stage, stored_duplicates

    stored = Task(id="synth/a", name="a", code=HANGS.replace("64, 64", "256, 256"), source="synth",
                  provenance={"seed_ids": [], "k": 1})
    resized = Task(id="synth/b", name="b", code=HANGS, source="synth", provenance={"seed_ids": [], "k": 1})
    other = Task(id="synth/c", name="c", source="synth", provenance={"seed_ids": [], "k": 1},
                 code="import torch\nimport torch.nn as nn\n\n\nclass Model(nn.Module):\n"
                      "    def __init__(self):\n        super().__init__()\n        self.conv = nn.Conv2d(3, 8, 3)\n\n"
                      "    def forward(self, x):\n        return torch.relu(self.conv(x)).sum(dim=1)\n\n\n"
                      "def get_inputs():\n    return [torch.randn(2, 3, 16, 16)]\n\n\ndef get_init_inputs():\n    return []\n")
    config = _config(tmp_path, scale_search=True)
    with BuildStore(tmp_path / "build.duckdb") as store:
        assert stored_duplicates(store, [resized, other]) == []  # nothing stored yet
        store.add_candidates([stored], 0)
        assert stored_duplicates(store, [resized, other]) == [resized]
        assert scale_stage(store, [], config, 1, [resized]) == []  # sized nothing: no seeds, no judge needed
        found = store.sized()[resized.sha256]
        assert (found["reason"], found["probes"], found["task"]) == (STORED_DUPLICATE, {}, None)
        counts = scale_counts(store, [resized])
        assert counts["scale_in"] == 1 and counts["scale_kept"] == 0 and counts[f"scale_dropped_{STORED_DUPLICATE}"] == 1


@pytest.mark.slow
def test_the_standing_judges_serve_every_round_of_a_streamed_build(tmp_path, kernelbench_path, monkeypatch):
    """An overlapped build whose scale search and filter passes stream (the GPU defaults; asked for here
    on the CPU) starts its probe judges and its filter judges once, for all its rounds: no more judges
    of either than --parallel (a round used to start its own), and a rerun after it still completes."""
    from cudagym.eval import feed

    started: list[str] = []
    run_judge = feed._run_judge_once
    monkeypatch.setattr(feed, "_run_judge_once", lambda request, *a, **k: (started.append(request["mode"]),
                                                                          run_judge(request, *a, **k))[1])
    config = _config(tmp_path, overlap=True, round_size=4, scale_search=True, max_scale=4, scale_start=1,
                     scale_probes=2, filter_passes=2, filter_stream=True)
    funnel = build_dataset(config)
    assert funnel["status"] == "complete" and len(read_build_rows(tmp_path / "dataset")) == 6
    db = duckdb.connect(str(tmp_path / "build.duckdb"), read_only=True)
    filtered_rounds = db.execute("SELECT count(DISTINCT round) FROM candidates JOIN filtered USING (sha256)").fetchone()[0]
    probed_rounds = db.execute("SELECT count(DISTINCT round) FROM candidates JOIN sized USING (sha256)").fetchone()[0]
    db.close()
    assert filtered_rounds >= 2 and probed_rounds >= 2, (filtered_rounds, probed_rounds)
    assert 1 <= started.count("filter-probe") <= config.parallel, started
    assert 1 <= started.count("filter-check") <= config.parallel, started
    assert set(started) == {"filter-probe", "filter-check"}
    assert not evaluate._LIVE_JUDGES and not [t for t in threading.enumerate() if t.name.startswith("fed-judge")]


def _small_task(name: str, forward: str) -> Task:
    code = f'''import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return {forward}


def get_inputs():
    return [torch.randn(16, 32)]


def get_init_inputs():
    return []
'''
    return Task(id=name, name=name, code=code, source="test")


@pytest.mark.slow
def test_a_filter_stream_takes_tasks_while_it_decides_earlier_ones():
    """FilterStream on real judges (the check feed of `standing_judges`): tasks added while earlier ones
    are decided are decided too, each once; one added again while in flight goes in once; a task that
    passes its checks is timed and kept, a degenerate one dropped without timing; `serve` returns once
    closed and every task is decided."""
    from cudagym.synth.filter import FilterConfig, FilterStream, standing_judges

    config = FilterConfig(device="cpu", parallel=2, task_timeout_s=180.0, seed=1, two_pass=True, min_eager_ms=0.0)
    good, zeros, other = (_small_task("good", "torch.tanh(x) * 2 + x"), _small_task("zeros", "x * 0.0"),
                          _small_task("other", "torch.sigmoid(x) * 3 - x"))
    decided: dict[str, list] = {}
    checked: list[str] = []
    with standing_judges(config, probes=False, checks=True) as judges, ThreadPoolExecutor(1) as thread:
        stream = FilterStream(judges.checks, judges.check_pool.worker.env, config,
                              on_result=lambda task, result: decided.setdefault(task.id, []).append(result),
                              on_checked=lambda task, measured: checked.append(task.id))
        serving = thread.submit(stream.serve)
        assert stream.add([good, zeros]) == 2
        assert stream.add([good]) == 0  # in flight already
        assert stream.wait_until(lambda: len(decided) >= 1, timeout_s=300)
        assert stream.add([other]) == 1  # while the first ones may still be in flight
        stream.close()
        serving.result(timeout=300)
    assert {k: len(v) for k, v in decided.items()} == {"good": 1, "zeros": 1, "other": 1}
    assert decided["good"][0].keep and decided["other"][0].keep and decided["good"][0].t_eager_ms > 0
    assert decided["zeros"][0].reason == "degenerate_zeros" and decided["zeros"][0].timing_s is None
    assert sorted(checked) == ["good", "other"] and stream.outstanding == 0
    with pytest.raises(RuntimeError, match="closed"):
        stream.add([good])


@pytest.mark.slow
def test_a_streamed_build_sends_each_round_to_the_filter_without_waiting_for_the_round_before(
        tmp_path, kernelbench_path, monkeypatch):
    """Where the filter streams (the GPU default), the build keeps one FilterStream for all its rounds and
    adds a round's candidates while the earlier ones are still being decided (no barrier between
    rounds), composing the next round only while at most `stream_backlog` candidates wait in the filter.
    The filter is slowed here (each decision 0.5 s later, as a busy GPU would make it) so that the
    composing runs ahead of it."""
    from cudagym.synth import build
    from cudagym.synth.filter import FilterStream

    streams, adds, composes = set(), [], []
    add, handle, compose = FilterStream.add, FilterStream._handle, build.compose_stage

    def slow_handle(self, *args):
        time.sleep(0.5)
        return handle(self, *args)

    def recorded_add(self, tasks):
        streams.add(id(self))
        tasks = list(tasks)
        in_flight = self.outstanding
        sent = add(self, tasks)
        if sent:
            adds.append(in_flight)
        return sent

    def recorded_compose(store, seeds, config, round_, n, judges=None, **kw):
        composes.append((round_, n, [s.outstanding for s in live]))
        return compose(store, seeds, config, round_, n, judges, **kw)

    live: list[FilterStream] = []
    init = FilterStream.__init__
    monkeypatch.setattr(FilterStream, "__init__", lambda self, *a, **k: (init(self, *a, **k), live.append(self))[0])
    monkeypatch.setattr(FilterStream, "_handle", slow_handle)
    monkeypatch.setattr(FilterStream, "add", recorded_add)
    monkeypatch.setattr(build, "compose_stage", recorded_compose)
    config = _config(tmp_path, target=8, overlap=True, round_size=4, filter_passes=2, filter_stream=True, max_rounds=30)
    funnel = build_dataset(config)
    assert funnel["status"] == "complete" and len(read_build_rows(tmp_path / "dataset")) == 8
    assert len(streams) == 1  # one stream for the whole build
    assert len(adds) >= 2 and any(adds[1:]), adds  # a later round's candidates went in beside earlier ones
    assert composes[0][1] <= 2 and all(n <= 4 for _, n, _ in composes), composes  # a third of a round first
    assert all(outstanding[0] <= build.stream_backlog(config) for _, _, outstanding in composes), composes
    assert not evaluate._LIVE_JUDGES and not [t for t in threading.enumerate() if t.name.startswith("fed-judge")]


@pytest.mark.slow
def test_a_streamed_build_composes_the_next_round_while_this_one_is_sized(tmp_path, kernelbench_path, monkeypatch):
    """The round after this one is composed on a thread of its own (`RoundAhead`) while this one is sized
    and stored; what a round stores is what composing it in line would give (`compose_round` depends on the
    round and its size only), and no composing thread outlives the build."""
    from cudagym.synth import build
    from cudagym.synth.filter import FilterStream

    calls, compose_round = [], build.compose_round

    def recorded_compose_round(seeds, config, round_, n, stop=None):
        calls.append((round_, n, threading.current_thread().name))
        return compose_round(seeds, config, round_, n, stop)

    handle = FilterStream._handle
    monkeypatch.setattr(FilterStream, "_handle", lambda self, *a: (time.sleep(0.3), handle(self, *a))[1])
    monkeypatch.setattr(build, "compose_round", recorded_compose_round)
    config = _config(tmp_path, target=10, overlap=True, round_size=4, filter_passes=2, filter_stream=True, max_rounds=30)
    funnel = build_dataset(config)
    assert funnel["status"] == "complete"
    ahead = [(r, n) for r, n, thread in calls if thread.startswith("cudagym-compose")]
    assert ahead, calls  # rounds composed ahead, on the compose thread
    seeds, _ = crawl_stage(config)
    with BuildStore(tmp_path / "build.duckdb") as store:
        by_round = {}
        for seq, task in store.candidates():
            by_round.setdefault(store.db.execute("SELECT round FROM candidates WHERE seq = ?", [seq]).fetchone()[0],
                                set()).add(task.sha256)
        stored_rounds = sorted(store.rounds())
    used = {r: n for r, n in ahead if r in stored_rounds}
    assert used, (ahead, stored_rounds)  # a round composed ahead was the one stored
    earlier = set()
    for round_ in stored_rounds:
        n = used.get(round_) or next(n for r, n, _ in calls if r == round_)
        inline = {t.sha256 for t in compose_round(seeds, config, round_, n)[1]}
        mine = by_round.get(round_, set())
        assert mine <= inline and inline - mine <= earlier, round_  # all it composed, but for repeats of earlier rounds
        earlier |= inline
    deadline = time.monotonic() + 10
    while [t for t in threading.enumerate() if t.name.startswith("cudagym-compose")] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [t for t in threading.enumerate() if t.name.startswith("cudagym-compose")]


@pytest.mark.slow
def test_a_streamed_build_sends_candidates_to_the_filter_as_their_scale_search_ends(tmp_path, kernelbench_path,
                                                                                   monkeypatch):
    """With streamed probes, a candidate is stored as its search ends and goes on to the filter while the
    round's other searches still run (not with the round's end); the rounds' counts still add up to the
    candidates stored."""
    from cudagym.synth import build
    from cudagym.synth.filter import FilterStream

    added, ended, add, compose = [], {}, FilterStream.add, build.compose_stage

    def recorded_add(self, tasks):
        tasks = list(tasks)
        added.extend((task.sha256, time.monotonic()) for task in tasks)
        return add(self, tasks)

    def recorded_compose(store, seeds, config, round_, n, judges=None, **kw):
        result = compose(store, seeds, config, round_, n, judges, **kw)
        ended[round_] = time.monotonic()
        return result

    monkeypatch.setattr(build, "FEED_S", 0.0)
    monkeypatch.setattr(FilterStream, "add", recorded_add)
    monkeypatch.setattr(build, "compose_stage", recorded_compose)
    # a target far beyond what the rounds give: the filter always has room for what is sized
    config = _config(tmp_path, target=40, overlap=True, round_size=8, filter_passes=2, filter_stream=True, max_rounds=3,
                     scale_search=True, max_scale=6, scale_start=1, scale_probes=3, min_eager_ms=1.0, max_eager_ms=3.0)
    funnel = build_dataset(config)
    assert funnel["status"] == "short"
    with BuildStore(tmp_path / "build.duckdb") as store:
        round_of = dict(store.db.execute("SELECT sha256, round FROM candidates").fetchall())
        rounds = store.rounds()
        assert sum(r["stats"]["scale_kept"] for r in rounds.values()) == store.candidate_count() > 0
    early = [sha for sha, at in added if round_of[sha] in ended and at < ended[round_of[sha]]]
    assert early, (added, ended)  # sent on before its round ended


def test_a_round_composed_ahead_stops_with_the_build(tmp_path):
    """`RoundAhead.close` ends a round under way after the candidate in hand; `take` hands over only the round
    that was started."""
    from cudagym.synth.build import RoundAhead

    config = _config(tmp_path)
    seeds, _ = crawl_stage(config)
    ahead = RoundAhead(seeds, config)
    ahead.start(7, 3)
    assert ahead.take(6) == (0, None) and ahead.take(7) == (0, None)  # a round not asked for is forgotten
    ahead.start(8, 3)
    n, future = ahead.take(8)
    step, composed = future.result(timeout=60)
    assert n == 3 and len(composed) == 3 and step.stats["kept"] == 3
    ahead.start(9, 100_000)
    started = time.monotonic()
    while not ahead.future.running():
        time.sleep(0.01)
    ahead.close()
    step, composed = ahead.future.result(timeout=30)
    assert len(composed) < 100_000 and time.monotonic() - started < 30
    ahead = RoundAhead(seeds, _config(tmp_path, composer="llm"))
    ahead.start(1, 3)  # the llm composer composes in the round that asks, never ahead
    assert ahead.take(1) == (0, None)
    ahead.close()


@pytest.mark.slow
def test_a_streamed_build_refills_the_filter_from_a_backlog_before_it_drains(tmp_path, kernelbench_path, monkeypatch,
                                                                             capsys):
    """A resumed build with more candidates waiting than a batch (composed, never filtered) adds the rest
    as the filter makes room, while earlier ones are still in flight, instead of letting it drain first;
    the filter's lines come a pair per round composed (here none) and at the end, not per refill."""
    from cudagym.synth.filter import FilterStream

    config = _config(tmp_path, target=4, overlap=True, round_size=2, filter_passes=2, filter_stream=True, max_rounds=0)
    seeds, _ = crawl_stage(config)
    with BuildStore(tmp_path / "build.duckdb") as store:
        store.check_identity(config.identity())
        for round_ in range(4):
            compose_stage(store, seeds, config, round_, 2)
        assert len(store.candidates()) >= 6
    adds = []
    add, handle = FilterStream.add, FilterStream._handle

    def recorded_add(self, tasks):
        in_flight = self.outstanding
        sent = add(self, tasks)
        if sent:
            adds.append(in_flight)
        return sent

    monkeypatch.setattr(FilterStream, "_handle", lambda self, *a: (time.sleep(0.5), handle(self, *a))[1])
    monkeypatch.setattr(FilterStream, "add", recorded_add)
    funnel = build_dataset(config)  # max_rounds 0: nothing composed, only the backlog filtered
    assert funnel["status"] in ("complete", "short")
    db = duckdb.connect(str(tmp_path / "build.duckdb"), read_only=True)
    assert db.execute("SELECT max(round) FROM candidates").fetchone()[0] == 3
    assert db.execute("SELECT count(*) FROM filtered").fetchone()[0] >= 4
    db.close()
    assert len(adds) >= 2 and any(adds[1:]), adds  # refilled while candidates were in flight
    err = capsys.readouterr().err
    assert err.count("filter checks, streamed: ") == 1 and err.count("filter timing, streamed: ") == 1, err


SLOW = '''import time
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        time.sleep(0.5)
        return {op}(x) * 2 + x


def get_inputs():
    return [torch.randn(32, 32)]


def get_init_inputs():
    return []
'''


@pytest.mark.slow
def test_a_streamed_build_whose_composer_stops_lets_the_filter_decide_what_it_holds(tmp_path, kernelbench_path,
                                                                                    monkeypatch):
    """A composer that stops for its endpoint (not Ctrl-C) in a later round: the candidates the judges
    hold then (here two whose forward sleeps, still being checked) are decided and stored (the stream is
    closed and served to its end, not stopped), and the build publishes with the stop's reason."""
    from collections import Counter

    from cudagym.synth import build
    from cudagym.synth.compose import ComposeStopped
    from cudagym.synth.filter import FilterStream

    compose, calls, in_flight_at_stop, streams = build.compose_stage, [], [], []

    def stopping_compose(store, seeds, config, round_, n, judges=None, **kw):
        calls.append(round_)
        if len(calls) == 2:  # a round of two slow candidates
            slow = [Task(id=f"slow{i}", name=f"slow{i}", code=SLOW.format(op=op), source="synth",
                         provenance={"composer": "programmatic", "k": 1, "seed_ids": [], "seed_ops": []})
                    for i, op in enumerate(("torch.tanh", "torch.nn.functional.softsign"))]
            store.add_candidates(slow, round_)
            store.add_round(round_, Counter(kept=2), [])
            return 2
        if len(calls) == 3:  # then the endpoint goes away, while the judges check them
            in_flight_at_stop.extend(s.outstanding for s in streams)
            raise ComposeStopped("endpoint_down", "the endpoint stopped answering")
        return compose(store, seeds, config, round_, n, judges, **kw)

    init = FilterStream.__init__
    monkeypatch.setattr(FilterStream, "__init__", lambda self, *a, **k: (init(self, *a, **k), streams.append(self))[0])
    monkeypatch.setattr(build, "compose_stage", stopping_compose)
    config = _config(tmp_path, target=40, overlap=True, round_size=4, filter_passes=2, filter_stream=True, max_rounds=10)
    funnel = build_dataset(config)
    assert funnel["status"] == "stopped" and funnel["stopped"] == "endpoint_down"
    assert in_flight_at_stop and in_flight_at_stop[0] >= 2, in_flight_at_stop  # the slow two, at least
    db = duckdb.connect(str(tmp_path / "build.duckdb"), read_only=True)
    slow_decided = db.execute("SELECT count(*) FROM candidates JOIN filtered USING (sha256) WHERE name LIKE 'slow%'").fetchone()[0]
    db.close()
    assert slow_decided == 2 and streams[0].outstanding == 0  # everything sent was decided
    assert not evaluate._LIVE_JUDGES and not [t for t in threading.enumerate() if t.name.startswith("fed-judge")]
