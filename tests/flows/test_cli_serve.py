"""`cudagym serve` on bad input: one line on stderr, exit 1, no traceback, nothing served."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from cudagym.cli import main
from cudagym.flows.serve import DEPLOYMENTS, ServeConfig, parse_parameter


@pytest.mark.parametrize("argv, message", [
    (["--deployments", "leaderboard"], "unknown deployment 'leaderboard' (choose from build_dataset, refresh_leaderboard"),
    (["--cron", "audit=61 * * * *"], "bad cron string '61 * * * *' for audit"),
    (["--cron", "audit=every day"], "bad cron string 'every day' for audit"),
    (["--cron", "audit"], "--cron must look like NAME=VALUE"),
    (["--interval", "audit=soon"], "--interval audit= takes seconds"),
    (["--interval", "audit=0"], "interval for audit must be a positive number"),
    (["--cron", "audit=0 1 * * *", "--interval", "audit=60"], "audit: give a cron string or an interval, not both"),
    (["--deployments", "audit", "--cron", "train=0 1 * * *"], "train is not among the deployments to serve"),
    (["--param", "refresh_leaderboard.folder=x"], "refresh_leaderboard has no parameter 'folder'"),
    (["--param", "refresh_leaderboard=x"], "--param must look like NAME.KEY=VALUE"),
    (["--param", "refresh_leaderboard.n_checks=many"],
     "refresh_leaderboard: bad parameter value: n_checks: Input should be a valid integer"),
])
def test_bad_input_is_one_line(argv, message, capsys):
    assert main(["serve", *argv]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"cudagym: error: {message}") and err.count("\n") == 1, err


def test_config_defaults_and_parameters():
    config = ServeConfig(cron={"agent_rollouts": "0 1 * * *"}, interval_s={"refresh_leaderboard": 30.0})
    assert config.names == tuple(DEPLOYMENTS)
    assert config.schedule("build_dataset") == {"cron": "0 3 * * 0"}  # weekly
    assert config.schedule("refresh_leaderboard") == {"interval": 30.0}
    assert config.schedule("agent_rollouts") == {"cron": "0 1 * * *"} and config.schedule("train") == {}
    assert ServeConfig().schedule("refresh_leaderboard") == {"cron": "0 2 * * *"}  # nightly
    assert parse_parameter("audit.ids=[1, 2]") == ("audit", "ids", [1, 2])
    assert parse_parameter("audit.db=out/x.duckdb") == ("audit", "db", "out/x.duckdb")


def test_default_parameters_are_valid_runs_of_each_flow():
    """What a run started from the UI with the defaults gets: every flow accepts it, typed."""
    from cudagym.synth.build import BuildConfig

    for name, spec in DEPLOYMENTS.items():
        params = spec.load_flow().validate_parameters(dict(spec.parameters))
        if name == "build_dataset":
            assert isinstance(params["config"], BuildConfig) and params["config"].out == "out/build"


def _serve_subprocess(env_api_url: str | None, tmp_path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}
    env["PREFECT_HOME"] = str(tmp_path / "home")  # an empty profile: no API URL from a user's profile
    if env_api_url:
        env["PREFECT_API_URL"] = env_api_url
    return subprocess.run([sys.executable, "-m", "cudagym", "serve"], env=env, capture_output=True, text=True,
                          timeout=300, stdin=subprocess.DEVNULL)


@pytest.mark.slow
def test_no_api_says_how_to_start_one(tmp_path):
    result = _serve_subprocess(None, tmp_path)
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.splitlines() == ["cudagym: error: no Prefect API configured: start one with `prefect server start`"
                                          " and `export PREFECT_API_URL=http://127.0.0.1:4200/api`, or pass --start-server"]


@pytest.mark.slow
def test_unreachable_api_is_one_line(tmp_path, unused_port):
    url = f"http://127.0.0.1:{unused_port}/api"  # nothing listens there
    result = _serve_subprocess(url, tmp_path)
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.splitlines() == [f"cudagym: error: no Prefect API answers at {url}: start one with"
                                          " `prefect server start` (or pass --start-server), or fix PREFECT_API_URL"]
