"""Where a flow runs its judges, and the Prefect slot that keeps two GPU flows off one device.

Every flow that runs kernels (dataset filter, leaderboard eval, audit, agent rollouts, training)
holds its GPU's global concurrency limit (`device-cuda-0`, ...; limit 1) for as long as
it uses the device: a nightly leaderboard refresh waits for a rollout batch on the same GPU instead
of timing next to it. The limit is created on first use, so a flow run outside `cudagym serve` holds
it too. Inside a flow the judges also take the machine's GPU lock (`cudagym.eval.gpulock`), which
covers cudagym processes that Prefect does not run.
"""

from __future__ import annotations

import contextlib
import os
import re

DEVICE_SLOT_LEASE_S = 600  # renewed by Prefect while held; a crashed holder frees its slot after this


def resolve_device(device: str) -> str:
    """"auto": cuda:0 when a GPU is visible, else cpu; "cuda" means cuda:0; anything else as given."""
    if device == "auto":
        import torch

        return "cuda:0" if torch.cuda.is_available() else "cpu"
    if device == "cuda":
        return "cuda:0"
    if device != "cpu" and not re.fullmatch(r"cuda:\d+", device):
        raise ValueError(f"unknown device {device!r} (auto, cpu, cuda or cuda:N)")
    return device


def device_limit_name(device: str) -> str:
    """The global concurrency limit of a device: "device-cuda-0", "device-cpu"."""
    return "device-" + re.sub(r"[^a-z0-9]+", "-", resolve_device(device).lower()).strip("-")


def default_parallel(device: str) -> int:
    """Judges at once, as `cudagym eval run` picks them: one per core (up to 16) on a GPU, where
    timing stays exclusive; one on the CPU, where concurrent judges would time each other."""
    return min(16, os.cpu_count() or 1) if resolve_device(device).startswith("cuda") else 1


def eval_config(device: str, policy: str = "strict", timing_mode: str = "strict", precision: str = "strict",
                n_checks: int = 5, timeout_s: float = 60.0, tolerance: str = "paper"):
    """The judge's EvalConfig for a flow run, as the CLI builds it (on a GPU, with its timing cores)."""
    from cudagym.eval.checks import STRICT_TOLERANCE, Tolerance
    from cudagym.eval.evaluate import EvalConfig, with_timing_cpus

    if tolerance not in ("paper", "strict"):
        raise ValueError(f"unknown tolerance {tolerance!r} (paper or strict)")
    tol = STRICT_TOLERANCE if tolerance == "strict" else Tolerance()
    device = resolve_device(device)
    config = EvalConfig(device=device, policy=policy, timing_mode=timing_mode, precision=precision,
                        n_checks=n_checks, timeout_s=timeout_s, atol=tol.atol, rtol=tol.rtol)
    return with_timing_cpus(config) if device.startswith("cuda") else config


def ensure_device_limit(name: str) -> None:
    """Create the device's global concurrency limit (1 slot) if the Prefect API has none yet."""
    from prefect import get_client
    from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate
    from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound

    with get_client(sync_client=True) as client:
        try:
            client.read_global_concurrency_limit_by_name(name)
        except ObjectNotFound:
            with contextlib.suppress(ObjectAlreadyExists):  # another flow created it meanwhile
                client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name=name, limit=1))


@contextlib.contextmanager
def device_slot(device: str):
    """Hold the device's one slot (waiting for it) while the block runs; inside a Prefect flow run.
    A GPU only: CPU flows share the cores under the machine's CPU lock (`gpulock`), which already
    keeps their timing apart, and a slot held by a killed CPU run would stall every CPU flow of the
    server for a lease (a full test session once waited out its timeout on one)."""
    from prefect.concurrency.sync import concurrency

    if resolve_device(device) == "cpu":
        yield
        return
    name = device_limit_name(device)
    ensure_device_limit(name)
    with concurrency(name, occupy=1, strict=True, lease_duration=DEVICE_SLOT_LEASE_S):
        yield
