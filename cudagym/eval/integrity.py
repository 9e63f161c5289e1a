"""Tamper evidence inside the candidate's process.

Before the candidate is imported the runner takes a `Snapshot`: the identity of every callable in
the modules and classes the harness relies on (torch, torch.cuda, Tensor, nn.Module, time,
builtins, ...), the numeric-precision switches, the global module hooks, and the set of threads.
After import, construction and every call, the runner compares: a replaced function
(`monkeypatch`), a flipped precision switch (`precision_downcast`), a new global hook
(`monkeypatch`) or a thread that was not there before (`background_thread`) becomes a flag.
"""

from __future__ import annotations

import os
import sys
import threading
from dataclasses import dataclass, field


def _watched():
    import builtins
    import gc
    import math
    import time

    import torch
    import torch.autograd.profiler
    import torch.autograd.profiler_util as profiler_util
    import torch.nn.functional as F
    import torch.profiler

    modules = {"torch": torch, "torch.nn.functional": F, "torch.cuda": torch.cuda, "torch.testing": torch.testing,
               "torch.autograd": torch.autograd, "time": time, "builtins": builtins, "math": math, "gc": gc,
               "torch.backends.cudnn": torch.backends.cudnn,
               # the paper timing mode reads the profiler's events in the candidate's process
               "torch.profiler": torch.profiler, "torch.autograd.profiler": torch.autograd.profiler,
               "torch.autograd.profiler_util": profiler_util}
    modules.update({name: mod for name, mod in sys.modules.items() if name.startswith("cudagym.eval") and mod})
    classes = {"torch.Tensor": torch.Tensor, "torch.nn.Module": torch.nn.Module, "torch.cuda.Event": torch.cuda.Event,
               "torch.cuda.Stream": torch.cuda.Stream, "torch.nn.Parameter": torch.nn.Parameter,
               "torch.profiler.profile": torch.profiler.profile, "profiler_util.FunctionEvent": profiler_util.FunctionEvent,
               "profiler_util.EventList": profiler_util.EventList, "profiler_util.Interval": profiler_util.Interval}
    return modules, classes


def _settings() -> dict:
    import torch
    from torch.nn.modules import module as nn_module

    readers = {
        "matmul.allow_tf32": lambda: torch.backends.cuda.matmul.allow_tf32,
        "cudnn.allow_tf32": lambda: torch.backends.cudnn.allow_tf32,
        "float32_matmul_precision": torch.get_float32_matmul_precision,
        "matmul.allow_fp16_reduced_precision_reduction":
            lambda: torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction,
        "matmul.allow_bf16_reduced_precision_reduction":
            lambda: torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction,
        "global_hooks": lambda: sum(len(v) for k, v in vars(nn_module).items() if k.startswith("_global_") and isinstance(v, dict)),
        # A profile or trace hook runs candidate code inside the harness's own calls (e.g. to fill
        # an output lazily while it is being handed over, after the timed window).
        "interpreter_hooks": lambda: (sys.getprofile(), sys.gettrace(), threading.getprofile(), threading.gettrace()),
    }
    settings = {}
    for name, read in readers.items():
        try:
            settings[name] = read()
        except Exception as exc:  # torch refuses to read a mix of legacy and new precision APIs: that is a change too
            settings[name] = f"unreadable: {type(exc).__name__}"
    return settings


PRECISION_SETTINGS = {"matmul.allow_tf32", "cudnn.allow_tf32", "float32_matmul_precision",
                      "matmul.allow_fp16_reduced_precision_reduction", "matmul.allow_bf16_reduced_precision_reduction"}


def thread_ids() -> tuple[frozenset, frozenset]:
    """(Python thread idents, OS thread ids): the second also sees std::thread from C++ extensions."""
    try:
        os_threads = frozenset(os.listdir("/proc/self/task"))
    except OSError:
        os_threads = frozenset()
    return frozenset(sys._current_frames()), os_threads


def _thread_name(tid: str) -> str:
    try:
        with open(f"/proc/self/task/{tid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


@dataclass
class Snapshot:
    objects: dict = field(default_factory=dict)  # (owner, attr) -> object (a strong ref keeps ids unique)
    settings: dict = field(default_factory=dict)
    threads: tuple = (frozenset(), frozenset())

    @classmethod
    def take(cls) -> "Snapshot":
        modules, classes = _watched()
        objects = {}
        for owner, mod in modules.items():
            for attr, value in list(vars(mod).items()):
                if callable(value):
                    objects[(owner, attr)] = value
        for owner, klass in classes.items():
            for attr, value in list(vars(klass).items()):
                objects[(owner, attr)] = value
        return cls(objects, _settings(), thread_ids())

    def allow_threads(self, os_thread_ids) -> None:
        """Threads the harness itself started after the snapshot (the profiler's) are not new."""
        self.threads = (self.threads[0], self.threads[1] | frozenset(os_thread_ids))

    def changes(self) -> dict[str, list[str]]:
        """Flag name -> details of what differs from now."""
        modules, classes = _watched()
        changed = []
        for (owner, attr), value in self.objects.items():
            holder = modules.get(owner) or classes.get(owner)
            if holder is None or vars(holder).get(attr, _MISSING) is not value:
                changed.append(f"{owner}.{attr}")
        for owner, klass in classes.items():  # new attributes on a class override inherited behaviour
            changed += [f"{owner}.{attr}" for attr in vars(klass) if (owner, attr) not in self.objects]
        flags: dict[str, list[str]] = {}
        if changed:
            flags["monkeypatch"] = sorted(changed)[:20]
        now = _settings()
        settings_changed = [k for k in self.settings if now[k] != self.settings[k]]
        if any(k in PRECISION_SETTINGS for k in settings_changed):
            flags["precision_downcast"] = [f"{k}={now[k]}" for k in settings_changed if k in PRECISION_SETTINGS]
        if "global_hooks" in settings_changed:
            flags.setdefault("monkeypatch", []).append("global module hooks")
        if "interpreter_hooks" in settings_changed:
            flags.setdefault("monkeypatch", []).append("profile/trace hook installed")
        py_now, os_now = thread_ids()
        new_threads = (py_now - self.threads[0]) | (os_now - self.threads[1])
        if new_threads:
            names = sorted({_thread_name(t) for t in os_now - self.threads[1]} - {""})
            flags["background_thread"] = [f"{len(new_threads)} new thread(s)" + (f": {', '.join(names)}"[:200] if names else "")]
        return flags


_MISSING = object()
