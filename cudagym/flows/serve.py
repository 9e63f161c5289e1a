"""`cudagym serve`: register cudagym's flows as Prefect deployments and run their scheduled and
UI-started runs from this process (`flow.to_deployment` + `prefect.serve`: no work pool, no worker).

Deployments (`DEPLOYMENTS`), each named `<flow>/cudagym` in the UI, with its flow's typed parameters
editable there:

    build_dataset        weekly (Sunday 03:00 UTC)   dataset funnel
    refresh_leaderboard  nightly (02:00 UTC)         leaderboard metrics and per-problem tables
    audit                weekly (Saturday 04:00 UTC) KernelBench audit table
    agent_rollouts       off until given a schedule  reward distribution
    train                off until given a schedule  (rft -> value -> ppo; needs rollouts and a model)

Runs of one deployment never overlap (deployment concurrency limit 1); flows that run kernels hold
their device's global concurrency limit while they do (`devices.device_slot`), so two of them never
share a GPU. Registering again updates the deployments in place (Prefect keys them by flow and
deployment name): a second `cudagym serve` never duplicates them. SIGTERM or Ctrl-C stops serving
and pauses the schedules of what was served; the next `cudagym serve` resumes them.

The Prefect API is `PREFECT_API_URL` (environment or Prefect profile); `start_local_server` starts
one on 127.0.0.1 (`--start-server`; the tests start theirs with it too).
"""

from __future__ import annotations

import importlib
import inspect
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

DEPLOYMENT_NAME = "cudagym"  # the deployment half of "<flow>/cudagym"
DEFAULT_PORT = 4200
SERVER_START_TIMEOUT_S = 180.0  # `prefect server start` takes 20-30 s on 2 loaded cores
NO_API = ("no Prefect API configured: start one with `prefect server start` and"
          " `export PREFECT_API_URL=http://127.0.0.1:4200/api`, or pass --start-server")


class ServeError(ValueError):
    """Bad input or no API to serve against; the message is one line."""


@dataclass(frozen=True)
class Deployment:
    """A flow as a deployment: where the flow is, its default schedule, what it shows."""

    name: str  # the flow's name, what --deployments/--cron/--interval/--param take
    flow: str  # "module:function"
    description: str
    cron: str | None = None  # default schedule; None: no schedule until given one
    gpu: bool = True  # runs kernels: tagged "gpu", holds its device's slot
    parameters: dict = field(default_factory=dict)  # defaults beyond the flow's own

    def load_flow(self):
        module, attr = self.flow.split(":")
        return getattr(importlib.import_module(module), attr)

    @property
    def full_name(self) -> str:
        return f"{self.name}/{DEPLOYMENT_NAME}"


DEPLOYMENTS = {d.name: d for d in (
    Deployment("build_dataset", "cudagym.flows.build_dataset:build_dataset",
               "Crawl, compose, filter, dedup, decontaminate, label and publish the fused-operator task set"
               " (resumable), optionally push it to the Hub; artifacts: dataset-funnel, dataset-k-distribution.",
               cron="0 3 * * 0", parameters={"config": {"out": "out/build"}}),
    Deployment("refresh_leaderboard", "cudagym.flows.refresh_leaderboard:refresh_leaderboard",
               "Evaluate new submission folders under watch_dir, update the eval store, render the HTML"
               " leaderboard; artifacts: leaderboard-metrics, leaderboard-problems, leaderboard-progress.",
               cron="0 2 * * *"),
    Deployment("audit", "cudagym.flows.audit:audit",
               "Which problems' checks accept a degenerate answer (cudagym audit kernelbench);"
               " artifact: kernelbench-audit.", cron="0 4 * * 6"),
    Deployment("agent_rollouts", "cudagym.flows.agent_rollouts:agent_rollouts",
               "A batch of agent rollouts (cudagym.agent.rollout); artifacts: rollout-rewards, rollout-summary."),
    Deployment("train", "cudagym.flows.train:train",
               "RFT -> value pretraining -> PPO on an agent run's rollouts (cudagym.train), each stage resumable;"
               " artifacts: train-rft-curve, train-value-curve, train-ppo-curve."),
)}


def parse_assignment(text: str, what: str) -> tuple[str, str]:
    """"NAME=VALUE" -> (NAME, VALUE)."""
    name, sep, value = text.partition("=")
    if not sep or not name.strip() or not value.strip():
        raise ServeError(f"{what} must look like NAME=VALUE, got {text!r}")
    return name.strip(), value.strip()


def parse_parameter(text: str) -> tuple[str, str, object]:
    """"NAME.KEY=VALUE" -> (NAME, KEY, VALUE): VALUE as JSON if it parses (numbers, lists, null),
    else as a string."""
    target, value = parse_assignment(text, "--param")
    name, sep, key = target.partition(".")
    if not sep or not key:
        raise ServeError(f"--param must look like NAME.KEY=VALUE, got {text!r}")
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError:
        parsed = value
    return name, key, parsed


def check_cron(expr: str, name: str) -> None:
    from prefect.client.schemas.schedules import CronSchedule

    try:
        CronSchedule(cron=expr)
    except ValueError:
        raise ServeError(f"bad cron string {expr!r} for {name} (five fields: minute hour day month weekday,"
                         " e.g. '0 2 * * *')") from None


def check_parameters(name: str, values: dict) -> None:
    """The deployment's parameter defaults with `values` over them, checked against the flow's typed
    signature as a run's would be: names, then types (one line for the first problem)."""
    from prefect.exceptions import ParameterTypeError

    flow = DEPLOYMENTS[name].load_flow()
    known = inspect.signature(flow.fn).parameters
    for key in values:
        if key not in known:
            raise ServeError(f"{name} has no parameter {key!r} (it has {', '.join(known)})")
    flow_logger = logging.getLogger("prefect.flows")  # it logs the failure too; ours is the one line
    level, flow_logger.level = flow_logger.level, logging.CRITICAL
    try:
        flow.validate_parameters({**DEPLOYMENTS[name].parameters, **values})
    except ParameterTypeError as e:
        problems = [line.strip(" -") for line in str(e).splitlines()[1:] if line.strip()]
        raise ServeError(f"{name}: bad parameter value: {'; '.join(problems) or str(e).splitlines()[0]}") from None
    finally:
        flow_logger.setLevel(level)


@dataclass(frozen=True)
class ServeConfig:
    """What `cudagym serve` registers: the deployments, schedule overrides (cron or interval per
    deployment) and parameter defaults; where the API is."""

    names: tuple[str, ...] = tuple(DEPLOYMENTS)
    cron: dict[str, str] = field(default_factory=dict)
    interval_s: dict[str, float] = field(default_factory=dict)
    parameters: dict[str, dict] = field(default_factory=dict)
    start_server: bool = False
    port: int = DEFAULT_PORT

    def __post_init__(self):
        if not self.names:
            raise ServeError("no deployments named")
        for name in (*self.names, *self.cron, *self.interval_s, *self.parameters):
            if name not in DEPLOYMENTS:
                raise ServeError(f"unknown deployment {name!r} (choose from {', '.join(DEPLOYMENTS)})")
            if name not in self.names:
                raise ServeError(f"{name} is not among the deployments to serve ({', '.join(self.names)})")
        for name, expr in self.cron.items():
            check_cron(expr, name)
            if name in self.interval_s:
                raise ServeError(f"{name}: give a cron string or an interval, not both")
        for name, seconds in self.interval_s.items():
            if not seconds > 0:
                raise ServeError(f"interval for {name} must be a positive number of seconds, got {seconds}")
        for name, values in self.parameters.items():
            check_parameters(name, values)
        if not 0 < self.port < 65536:
            raise ServeError(f"port must be 1-65535, got {self.port}")

    def schedule(self, name: str) -> dict:
        """to_deployment's schedule arguments: the override, else the default cron, else none."""
        if name in self.interval_s:
            return {"interval": self.interval_s[name]}
        cron = self.cron.get(name, DEPLOYMENTS[name].cron)
        return {"cron": cron} if cron else {}

    def describe_schedule(self, name: str) -> str:
        schedule = self.schedule(name)
        if "interval" in schedule:
            return f"every {schedule['interval']:g} s"
        return f"cron {schedule['cron']}" if schedule else "no schedule (run it from the UI)"


def build_deployments(config: ServeConfig) -> list:
    """The RunnerDeployments to serve, in config order."""
    from prefect.types.entrypoint import EntrypointType

    out = []
    for name in config.names:
        spec = DEPLOYMENTS[name]
        out.append(spec.load_flow().to_deployment(
            name=DEPLOYMENT_NAME, description=spec.description, tags=["cudagym"] + (["gpu"] if spec.gpu else []),
            parameters={**spec.parameters, **config.parameters.get(name, {})}, concurrency_limit=1, **config.schedule(name),
            entrypoint_type=EntrypointType.MODULE_PATH))  # runs find the flow by module, from any folder
    return out


def api_health(url: str, timeout_s: float = 5.0) -> bool:
    """Whether a Prefect API answers at url (".../api")."""
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/health", timeout=timeout_s) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def configured_api_url() -> str | None:
    """PREFECT_API_URL from the environment or the active Prefect profile."""
    from prefect.settings import PREFECT_API_URL

    return PREFECT_API_URL.value() or None


class LocalServer:
    """`prefect server start` on 127.0.0.1 as a child process, with its own PREFECT_HOME if given
    (a SQLite database there); `stop()` ends it."""

    def __init__(self, port: int = DEFAULT_PORT, home: str | Path | None = None,
                 timeout_s: float = SERVER_START_TIMEOUT_S, extra_env: dict | None = None):
        self.url = f"http://127.0.0.1:{port}/api"
        self.ui_url = f"http://127.0.0.1:{port}"
        env = dict(os.environ, PREFECT_SERVER_ANALYTICS_ENABLED="false", **(extra_env or {}))
        env.pop("PREFECT_API_URL", None)
        env["PREFECT_UI_API_URL"] = self.url  # the UI's pages call the API here (default: port 4200)
        if home is not None:
            Path(home).mkdir(parents=True, exist_ok=True)
            env["PREFECT_HOME"] = str(home)
            env["PREFECT_API_DATABASE_CONNECTION_URL"] = f"sqlite+aiosqlite:///{Path(home).resolve() / 'prefect.db'}"
        log_dir = Path(home) if home is not None else Path(env.get("PREFECT_HOME", Path.home() / ".prefect"))
        log_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = log_dir / f"server-{port}.log"
        if api_health(self.url):
            raise ServeError(f"something already answers at {self.ui_url}: serve against it with"
                             f" PREFECT_API_URL={self.url}, or pick another --port")
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1",
                                          "--port", str(port)], env=env, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while not api_health(self.url, timeout_s=2.0):
            if self.proc.poll() is not None:
                raise ServeError(f"`prefect server start` exited with {self.proc.returncode}: {self._last_line()}")
            if time.monotonic() > deadline:
                self.stop()
                raise ServeError(f"the Prefect server did not answer at {self.url} within {timeout_s:.0f} s"
                                 f" (log: {self.log_path})")
            time.sleep(0.5)

    def _last_line(self) -> str:
        lines = [line for line in self.log_path.read_text(errors="replace").splitlines() if line.strip()]
        return lines[-1].strip() if lines else f"see {self.log_path}"

    def stop(self, timeout_s: float = 30.0) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class StopServing(KeyboardInterrupt):
    """SIGTERM before Prefect's runner has taken over the signal (while starting up)."""


def _stop_serving(signum, frame):
    raise StopServing()


def serve(config: ServeConfig, say=print) -> None:
    """Register the deployments and serve them until SIGTERM or Ctrl-C (then pause their schedules)."""
    from prefect import serve as prefect_serve
    from prefect.settings import PREFECT_API_URL, temporary_settings

    server = None
    # Until Prefect's runner installs its own SIGTERM handler (pause the schedules, stop), a SIGTERM
    # stops the start-up the same way a Ctrl-C does, instead of killing the process half-way.
    previous = signal.signal(signal.SIGTERM, _stop_serving) if threading.current_thread() is threading.main_thread() else None
    try:
        if config.start_server:
            say(f"starting a Prefect server on 127.0.0.1:{config.port} ...")
            server = LocalServer(config.port)
            url = server.url
        else:
            url = configured_api_url()
            if not url:
                raise ServeError(NO_API)
            if not api_health(url):
                raise ServeError(f"no Prefect API answers at {url}: start one with `prefect server start`"
                                 " (or pass --start-server), or fix PREFECT_API_URL")
        os.environ["PREFECT_API_URL"] = url  # the flow runs this process starts inherit it
        with temporary_settings(updates={PREFECT_API_URL: url}):
            deployments = build_deployments(config)
            for name in config.names:
                say(f"serving {DEPLOYMENTS[name].full_name}: {config.describe_schedule(name)}")
            say(f"UI: {url.removesuffix('/api')}/deployments; stop with Ctrl-C or SIGTERM")
            prefect_serve(*deployments, print_starting_message=False)
        say("stopped serving; schedules paused until the next `cudagym serve`")
    except StopServing:
        say("stopped before serving began")
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        if server is not None:
            server.stop()
