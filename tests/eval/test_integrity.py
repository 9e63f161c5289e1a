"""Tamper evidence: a replaced harness function, a flipped precision switch, a new thread or a new
global module hook each show up in Snapshot.changes(). Every scenario restores what it changed."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from cudagym.eval.integrity import Snapshot

_MISSING = object()


def patched_changes(owner, attr: str, replacement) -> dict:
    """Snapshot, replace owner.attr, read changes(), restore (delete if it was not the owner's own)."""
    snap = Snapshot.take()
    original = vars(owner).get(attr, _MISSING)
    try:
        setattr(owner, attr, replacement)
        return snap.changes()
    finally:
        if original is _MISSING:
            delattr(owner, attr)
        else:
            setattr(owner, attr, original)
        assert snap.changes() == {}, "restore failed"


def test_no_change_is_empty():
    snap = Snapshot.take()
    torch.randn(4, 4).sum()  # using torch is not tampering
    assert snap.changes() == {}


@pytest.mark.parametrize("owner, attr, name", [
    (torch.cuda, "synchronize", "torch.cuda.synchronize"),
    (time, "perf_counter", "time.perf_counter"),
    (torch, "allclose", "torch.allclose"),
    (torch.Tensor, "__eq__", "torch.Tensor.__eq__"),  # a new attribute on the class, shadowing TensorBase's
    (torch.Tensor, "sum", "torch.Tensor.sum"),
    (torch.nn.Module, "__call__", "torch.nn.Module.__call__"),
])
def test_replaced_function_is_monkeypatch(owner, attr, name):
    flags = patched_changes(owner, attr, lambda *a, **k: True)
    assert name in flags.get("monkeypatch", []), flags


def test_wrapper_that_calls_the_original_is_still_a_patch():
    original = torch.cuda.synchronize
    flags = patched_changes(torch.cuda, "synchronize", lambda *a, **k: original(*a, **k))
    assert flags["monkeypatch"] == ["torch.cuda.synchronize"]


def test_harness_module_patch_is_monkeypatch():
    import cudagym.eval.checks as checks

    flags = patched_changes(checks, "compare", lambda *a, **k: None)
    assert "cudagym.eval.checks.compare" in flags["monkeypatch"]


def test_tf32_switch_is_precision_downcast():
    snap = Snapshot.take()
    original = torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = not original
        flags = snap.changes()
    finally:
        torch.backends.cuda.matmul.allow_tf32 = original
    assert any(d.startswith("matmul.allow_tf32=") for d in flags["precision_downcast"])
    assert "monkeypatch" not in flags
    assert snap.changes() == {}


def test_matmul_precision_is_precision_downcast():
    snap = Snapshot.take()
    original = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("medium" if original != "medium" else "highest")
        flags = snap.changes()
    finally:
        torch.set_float32_matmul_precision(original)
    assert "precision_downcast" in flags


def test_global_forward_hook_is_monkeypatch():
    snap = Snapshot.take()
    handle = torch.nn.modules.module.register_module_forward_hook(lambda mod, inp, out: out)
    try:
        flags = snap.changes()
    finally:
        handle.remove()
    assert "global module hooks" in flags["monkeypatch"]
    assert snap.changes() == {}


def test_new_thread_is_background_thread():
    snap = Snapshot.take()
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait, args=(10,), daemon=True)
    thread.start()
    try:
        flags = snap.changes()
    finally:
        stop.set()
        thread.join()
    assert set(flags) == {"background_thread"}
    assert "new thread" in flags["background_thread"][0]
    assert snap.changes() == {}  # gone again once it ended


def test_profile_hook_is_monkeypatch():
    """A profile hook runs candidate code inside the harness's calls (a lazy output fill)."""
    import sys

    snap = Snapshot.take()
    previous = sys.getprofile()
    sys.setprofile(lambda frame, event, arg: None)
    try:
        flags = snap.changes()
    finally:
        sys.setprofile(previous)
    assert "profile/trace hook installed" in flags["monkeypatch"]
    assert snap.changes() == {}
