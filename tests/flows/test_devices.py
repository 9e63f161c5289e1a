"""Devices of flow runs: names, configs, and the Prefect slot that keeps two flows off one device
(against the real test server)."""

from __future__ import annotations

import pytest

from cudagym.flows.devices import default_parallel, device_limit_name, device_slot, eval_config, resolve_device


def test_device_names_and_configs():
    assert resolve_device("cuda") == "cuda:0" and resolve_device("cpu") == "cpu"
    assert resolve_device("auto") in ("cpu", "cuda:0")
    assert device_limit_name("cuda:1") == "device-cuda-1" and device_limit_name("cpu") == "device-cpu"
    with pytest.raises(ValueError, match="unknown device 'gpu0'"):
        resolve_device("gpu0")
    config = eval_config("cpu", policy="permissive", n_checks=2, tolerance="strict")
    assert (config.device, config.policy, config.n_checks, config.atol) == ("cpu", "permissive", 2, 1e-4)
    assert default_parallel("cpu") == 1
    with pytest.raises(ValueError, match="unknown tolerance"):
        eval_config("cpu", tolerance="loose")


@pytest.mark.slow
def test_a_device_has_one_slot(prefect_server, prefect_client):
    """The limit is created on first use with one slot; a second holder waits (here: times out) while
    the first holds it, and gets it once released."""
    from prefect.concurrency.sync import concurrency

    name = device_limit_name("cuda:7")  # a device no other test uses
    with device_slot("cuda:7"):
        limit = prefect_client.read_global_concurrency_limit_by_name(name)
        assert (limit.limit, limit.active_slots) == (1, 1)
        with pytest.raises(TimeoutError):
            with concurrency(name, occupy=1, timeout_seconds=3, strict=True):
                pass
    with concurrency(name, occupy=1, timeout_seconds=30, strict=True):
        assert prefect_client.read_global_concurrency_limit_by_name(name).active_slots == 1
    assert prefect_client.read_global_concurrency_limit_by_name(name).active_slots == 0
