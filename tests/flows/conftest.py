"""One real Prefect server for the flow tests (`prefect server start` on 127.0.0.1, a free port, a
temporary PREFECT_HOME with its own SQLite database), started once per session: it takes 20-30 s."""

from __future__ import annotations

import os
import socket

import pytest

from cudagym.flows.serve import LocalServer


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def prefect_server(tmp_path_factory):
    """The server (`.url`: its API); the health check has answered."""
    server = LocalServer(free_port(), home=tmp_path_factory.mktemp("prefect-server"), timeout_s=240)
    yield server
    server.stop()


@pytest.fixture
def prefect_client(prefect_server):
    """A sync Prefect client of the test server (settings pointed at it for the test's duration)."""
    from prefect import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: prefect_server.url}):
        with get_client(sync_client=True) as client:
            yield client


@pytest.fixture
def serve_env(prefect_server, tmp_path):
    """Environment for a `cudagym serve` subprocess against the test server: the runner polls often."""
    return dict(os.environ, PREFECT_API_URL=prefect_server.url, PREFECT_RUNNER_POLL_FREQUENCY="2",
                PREFECT_HOME=str(tmp_path / "prefect-home"), PREFECT_SERVER_ANALYTICS_ENABLED="false")


@pytest.fixture
def unused_port() -> int:
    """A port nothing listens on (just freed)."""
    return free_port()
