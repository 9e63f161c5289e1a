"""`cudagym serve` against a real Prefect server: it registers the deployments, an interval deployment
(refresh_leaderboard over a watched folder on the CPU task set) fires on its own and its table
artifacts list the submission dropped in, a UI-style run of `train` without rollouts fails with one line, SIGTERM
stops serving cleanly, and a second serve updates the same deployments instead of adding more."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cudagym.flows import artifacts
from cudagym.flows.serve import DEPLOYMENTS
from cudagym.flows.train import NO_ROLLOUTS

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
WAIT_S = 420  # one CPU eval of two problems (a C++ build) on a loaded 2-core machine, with room to spare


def wait_for(what: str, check, timeout_s: float = WAIT_S, poll_s: float = 1.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(poll_s)
    raise AssertionError(f"timed out waiting for {what}")


def start_serve(args: list[str], env: dict, cwd: Path, log: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "cudagym", "serve", *args], env=env, cwd=cwd,
                            stdout=open(log, "w"), stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


def stop_serve(proc: subprocess.Popen, log: Path) -> str:
    """SIGTERM: exit 0, the schedules paused, the last line says so, no traceback on the way out."""
    proc.send_signal(signal.SIGTERM)
    try:
        rc = proc.wait(120)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    out = log.read_text()
    assert rc == 0, out[-3000:]
    shutdown = out[out.rindex("SIGTERM received"):]  # a failed flow run logs Prefect's traceback before this
    assert "All deployments have been paused" in shutdown and "Traceback" not in shutdown, shutdown[-3000:]
    assert out.rstrip().endswith("stopped serving; schedules paused until the next `cudagym serve`"), out[-2000:]
    return out


def ours(client) -> dict:
    """{flow name: deployment} of the deployments named `cudagym`."""
    flows = {f.id: f.name for f in client.read_flows()}
    return {flows[d.flow_id]: d for d in client.read_deployments() if d.name == "cudagym"}


def _key_filter(key: str):
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    return ArtifactFilter(key=ArtifactFilterKey(any_=[key]))


def latest_table(client, key: str) -> list[dict] | None:
    found = client.read_artifacts(artifact_filter=_key_filter(key))
    if not found:
        return None
    newest = max(found, key=lambda a: a.created)
    return json.loads(newest.data) if isinstance(newest.data, str) else newest.data


def completed_runs(client, flow_name: str) -> list:
    from prefect.client.schemas.filters import (FlowFilter, FlowFilterName, FlowRunFilter, FlowRunFilterState,
                                                FlowRunFilterStateType)
    from prefect.client.schemas.objects import StateType

    completed = FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType.COMPLETED]))
    return client.read_flow_runs(flow_filter=FlowFilter(name=FlowFilterName(any_=[flow_name])),
                                 flow_run_filter=FlowRunFilter(state=completed))


@pytest.mark.slow
@pytest.mark.timeout(1500)  # its waits add up past the suite's 600 s on a slow machine
def test_serve_registers_fires_reports_and_stops(prefect_client, serve_env, tmp_path):
    from prefect.deployments import run_deployment

    # Two problems judged without a C++ build: a reward hack (rejected) and a torch-ops kernel (passes
    # under the permissive policy).
    problems = tmp_path / "problems"
    problems.mkdir()
    for name in ("1_2_ReLU_on_rand.py", "2_1_Linear_ReLU_scale.py"):
        shutil.copy(EXAMPLES / "problems" / name, problems / name)
    watch = tmp_path / "watch"
    (watch / "notes").mkdir(parents=True)  # not a submission: ignored
    params = {"watch_dir": str(watch), "problems": str(problems), "device": "cpu", "policy": "permissive",
              "n_checks": 2, "timeout_s": 120, "db": str(tmp_path / "lb.duckdb"), "html_out": str(tmp_path / "site")}
    args = ["--interval", "refresh_leaderboard=15", "--cron", "audit=30 5 * * 1"]
    args += [f"--param=refresh_leaderboard.{k}={json.dumps(v) if not isinstance(v, str) else v}" for k, v in params.items()]
    log = tmp_path / "serve.log"
    proc = start_serve(args, serve_env, tmp_path, log)  # from another folder: flows are found by module
    try:
        deployments = wait_for("the deployments", lambda: (d := ours(prefect_client)) and len(d) == len(DEPLOYMENTS) and d,
                               timeout_s=180)
        assert set(deployments) == set(DEPLOYMENTS)
        schedules = {name: [s.schedule for s in d.schedules] for name, d in deployments.items()}
        assert schedules["refresh_leaderboard"][0].interval.total_seconds() == 15
        assert schedules["audit"][0].cron == "30 5 * * 1"  # --cron replaces the default
        assert schedules["build_dataset"][0].cron == DEPLOYMENTS["build_dataset"].cron
        assert schedules["agent_rollouts"] == [] and schedules["train"] == []  # off until enabled
        assert deployments["refresh_leaderboard"].parameters["policy"] == "permissive"
        assert "watch_dir" in deployments["refresh_leaderboard"].parameter_openapi_schema["properties"]
        assert "gpu" in deployments["audit"].tags

        # The interval deployment fires on its own: a first run finds nothing; then a submission is
        # dropped into the watched folder, and a later run evaluates it.
        wait_for("a first refresh_leaderboard run", lambda: completed_runs(prefect_client, "refresh_leaderboard"))
        assert latest_table(prefect_client, artifacts.LEADERBOARD_KEY) == []
        drop = tmp_path / "incoming"
        for level, name in (("level1", "2_ReLU_on_rand.py"), ("level2", "1_Linear_ReLU_scale.py")):
            (drop / level).mkdir(parents=True)
            shutil.copy(EXAMPLES / "submission_cpu" / level / name, drop / level / name)
        drop.rename(watch / "mine")  # appears at once, whole
        metrics = wait_for("the leaderboard table to list it", lambda: latest_table(prefect_client, artifacts.LEADERBOARD_KEY))
        assert [(r["submission"], r["n"], r["pass_rate"]) for r in metrics] == [("mine", 1, 1.0)]  # L1/2 degenerate: left out
        rows = {(r["level"], r["problem_id"]): r for r in latest_table(prefect_client, artifacts.PROBLEMS_KEY)}
        assert set(rows) == {(1, 2), (2, 1)} and {r["submission"] for r in rows.values()} == {"mine"}
        assert rows[(2, 1)]["status"] == "pass" and rows[(2, 1)]["reward"] >= 1
        assert rows[(1, 2)]["status"] == "rejected" and rows[(1, 2)]["degenerate"]
        assert "mine" in (tmp_path / "site" / "index.html").read_text()
        progress = prefect_client.read_artifacts(artifact_filter=_key_filter(artifacts.LEADERBOARD_PROGRESS_KEY))
        assert progress and max(a.created for a in progress) and all(a.type == "progress" for a in progress)

        # A run of train started by hand (as from the UI) with no rollouts to train on fails with one line.
        run = run_deployment("train/cudagym", timeout=180)
        assert run.state.is_failed() and run.state.message.startswith(NO_ROLLOUTS)
        assert len(run.state.message.splitlines()) == 1
        # The run's state is final before its process has printed Prefect's traceback and exited; wait
        # for that, or the traceback lands after SIGTERM and reads as the serve's own.
        wait_for("the train run's process to print its end", lambda: "prefect.exceptions.FailedRun" in log.read_text(),
                 timeout_s=120)
    finally:
        out = stop_serve(proc, log)
    assert "serving refresh_leaderboard/cudagym: every 15 s" in out
    assert all(d.paused for d in ours(prefect_client).values())  # SIGTERM paused the schedules

    # A second serve updates the same deployments (and resumes their schedules); none is added.
    runs_before = len(completed_runs(prefect_client, "refresh_leaderboard"))
    proc = start_serve(["--deployments", "refresh_leaderboard,audit", *args], serve_env, tmp_path, log)
    try:
        wait_for("the schedules to resume", lambda: not ours(prefect_client)["audit"].paused, timeout_s=180)
        again = ours(prefect_client)
        assert sorted(again) == sorted(DEPLOYMENTS) and len(prefect_client.read_deployments()) == len(DEPLOYMENTS)
        assert {name: d.id for name, d in again.items()} == {name: d.id for name, d in deployments.items()}
        assert [s.schedule.cron for s in again["audit"].schedules] == ["30 5 * * 1"]  # replaced, not added
        wait_for("a run served by the second serve",
                 lambda: len(completed_runs(prefect_client, "refresh_leaderboard")) > runs_before)
    finally:
        stop_serve(proc, log)
