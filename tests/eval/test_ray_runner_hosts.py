"""The ray runner across hosts: a cluster of two fake one-GPU hosts joined by address; one host dies mid-run."""

from __future__ import annotations

import os
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from cudagym.eval.evaluate import EvalConfig
from cudagym.eval.ray_runner import RayPool
from cudagym.eval.store import Store
from tests.eval.ray_kill import run_six_jobs_killing

ray = pytest.importorskip("ray")


@pytest.fixture
def two_hosts():
    from ray.cluster_utils import Cluster

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # offline
    # A dead host is noticed after 3 missed health checks 0.5 s apart (Ray's default is much longer).
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "num_gpus": 1, "include_dashboard": False,
        "_system_config": {"health_check_period_ms": 500, "health_check_failure_threshold": 3,
                           "health_check_initial_delay_ms": 0}})
    other = cluster.add_node(num_cpus=1, num_gpus=1)
    cluster.wait_for_nodes()
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the job below travels by value
    yield cluster, other
    cluster.shutdown()


def node_job(i: int, marks: str, seconds: float, worker) -> str:
    node = ray.get_runtime_context().get_node_id()
    Path(marks, f"{i}.{node}").touch()
    time.sleep(seconds)
    return node


def test_jobs_of_a_dead_host_finish_on_the_other_and_each_is_recorded_once(two_hosts, tmp_path):
    cluster, other = two_hosts
    marks = tmp_path / "marks"
    marks.mkdir()
    # Joined by address, as `--runner ray --address` does: this cudagym travels to the workers.
    with Store(tmp_path / "runs.duckdb") as store, RayPool(EvalConfig(device="cpu"), parallel=2,
                                                          address=cluster.address) as pool:
        assert {w["node_id"] for w in pool.workers.values()} == {cluster.head_node.node_id, other.node_id}
        calls, finished_on, stored, on_dead_host = run_six_jobs_killing(
            pool, store, node_job, marks, other.node_id, lambda: cluster.remove_node(other, allow_graceful=False))
    assert calls == Counter(range(6)) and stored == [(i, 1) for i in range(6)]
    assert on_dead_host and all(finished_on[i] == cluster.head_node.node_id for i in on_dead_host)
    assert not ray.is_initialized()  # the pool joined the cluster, so it left it
