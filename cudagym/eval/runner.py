"""The candidate's process: imports the untrusted ModelNew and runs it on the judge's request.

Started by the judge as `python -m cudagym.eval.runner FD WORKDIR [WRITABLE...]` with one end of a
socket pair. It isolates itself (no network, read-only file system but its workdir) before
importing torch, then serves requests. Requests come from the trusted judge as pickles (on CUDA
the tensors travel as IPC handles: inputs and the output buffers the candidate's results are
copied into); replies go back as JSON (plus `torch.save` bytes of CPU outputs), which the judge
parses without unpickling. Reference outputs never exist in this process.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import sys
import tempfile
import traceback


def _one_line(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip()
    lines = [ln for ln in text.splitlines() if ln.strip()]
    # Build failures put the useful compiler line in the middle; keep the first error line if any.
    errors = [ln for ln in lines if "error" in ln.lower()]
    return " ".join((errors[:2] if len(lines) > 3 and errors else lines[:2]))[:400]


class Runner:
    def __init__(self, conn, sandbox: str):
        self.conn, self.sandbox = conn, sandbox
        self.model = None
        self.timing_sources: list[list] = []
        self.timing_slots: list[list] = []
        self.empty_like, self.empty_outputs = None, []  # an empty rep's stand-in outputs and their shapes

    def reply(self, **msg) -> None:
        self.conn.send_bytes(json.dumps(msg).encode())

    def serve(self) -> None:
        while True:
            try:
                request = pickle.loads(self.conn.recv_bytes())
            except EOFError:
                return
            op = request.pop("op")
            if op == "exit":
                self.reply(ok=True)
                return
            try:
                getattr(self, f"op_{op}")(**request)
            except Exception as exc:  # the candidate's exception is a verdict, never a crash
                self.reply(ok=False, status="runtime_error", reason=_one_line(exc),
                           trace=traceback.format_exc()[-2000:])

    # -- requests ---------------------------------------------------------------------------------
    def op_load(self, code: str, device: str, policy: str, task_dtypes: list[str], timing_mode: str = "strict",
                precision: str = "strict", files: dict | None = None) -> None:
        """Import the candidate (this builds its extension), after snapshotting everything it could tamper with."""
        import torch

        # Imported before the candidate, so the snapshot covers every harness function it could replace.
        import cudagym.eval.checks  # noqa: F401
        import cudagym.eval.guard  # noqa: F401
        from cudagym.eval.integrity import Snapshot, thread_ids
        from cudagym.eval.timing import TRACE_ENV, Timer, timer_method

        self.device, self.policy, self.task_dtypes = device, policy, set(task_dtypes)
        set_fp32_precision(precision)
        if device.startswith("cuda"):
            torch.cuda.set_device(device)
        warm_up(device, profiler=timing_mode == "paper" or bool(os.environ.get(TRACE_ENV)))
        self.timer = Timer(device, census=lambda: thread_ids()[1], method=timer_method(timing_mode))
        self.snapshot = Snapshot.take()

        # A candidate with files builds from them by path (cpp_extension.load(sources=[...])); ninja
        # rebuilds when a path or a file's mtime changes, so they live in the build directory keyed by
        # their content (judge.candidate_key), where a re-run finds them as they were.
        folder = os.path.join(os.environ.get("TORCH_EXTENSIONS_DIR", os.getcwd()), "src") if files else os.getcwd()
        path = os.path.join(folder, "candidate.py")
        write_candidate_files(folder, {"candidate.py": code, **(files or {})})
        try:
            import importlib.util

            spec = importlib.util.spec_from_file_location("candidate", path)
            module = importlib.util.module_from_spec(spec)
            sys.modules["candidate"] = module
            spec.loader.exec_module(module)
        except BaseException as exc:  # build failures, syntax errors, SystemExit from a build tool
            return self.reply(ok=False, status="compile_error", reason=_one_line(exc))
        self.model_cls = getattr(module, "ModelNew", None)
        if not isinstance(self.model_cls, type):
            return self.reply(ok=False, status="compile_error", reason="candidate defines no class ModelNew")
        self.reply(ok=True, flags=self.snapshot.changes(), sandbox=self.sandbox)

    def op_init(self, init_args: list, state_dict: dict, init_seed: int, gpu_memory_fraction: float | None = None) -> None:
        """Construct ModelNew with the reference's weights (and the same seed, for KernelBench-style candidates)."""
        import torch

        if gpu_memory_fraction and self.device.startswith("cuda"):
            torch.cuda.set_per_process_memory_fraction(gpu_memory_fraction)
        torch.manual_seed(init_seed)
        model = self.model_cls(*init_args)
        if isinstance(model, torch.nn.Module):
            model = model.to(self.device)
            own = model.state_dict()
            matching = {k: v for k, v in state_dict.items() if k in own and own[k].shape == v.shape}
            if matching:
                model.load_state_dict(matching, strict=False)
        self.model = model
        self.reply(ok=True, flags=self.snapshot.changes(), loaded_keys=len(state_dict))

    def op_call(self, inputs: list, buffers: list | None, guard: bool) -> None:
        import torch

        from cudagym.eval.guard import OpRecord, make_guard

        record = OpRecord()
        # On CUDA, guarded calls get the judge's shared copy, so the judge sees any write to it
        # itself; every other call works on private memory, like timed calls. Either way this
        # process compares the inputs it passed with a copy taken before (CPU inputs arrive by
        # value, so here is the only place a write can be seen).
        passed = inputs if guard and self.device.startswith("cuda") else clone_inputs(inputs)
        pristine = clone_inputs(passed)
        with torch.no_grad():
            if guard:
                with make_guard(record):
                    out = self.model(*passed)
            else:
                out = self.model(*passed)
            self.timer.sync()
        flags = self.snapshot.changes()
        flags.update(record.violations(self.policy, self.task_dtypes))
        flags.update(_input_writes(passed, pristine))
        self._send_outputs(out, buffers, flags, ops=sorted(record.python_calls | record.cpp_aten)[:50])

    def op_set_timing_inputs(self, sets: list[list]) -> None:
        """Keep the judge's input sets as sources, and two private slots (memory this process
        allocated, as the judge's eager reference uses its own; inputs mapped from another process
        can run measurably slower)."""
        self.timing_sources = sets
        self.timing_slots = [clone_inputs(sets[0]), clone_inputs(sets[0])]
        self.reply(ok=True)

    def op_rep(self, slot: int, content: int, buffers: list | None) -> None:
        """Load input set `content` into `slot` (outside the timed region), time one call, then hand
        its output over in the same round trip: the judge decides afterwards, in secret, whether to
        check it, and its wall clock covers whatever the call really took."""
        import torch

        inputs = self.load_slot(slot, content)
        self.timer.flush()
        with torch.no_grad():
            ms, out = self.timer.time_ms(lambda: self.model(*inputs))
        self._send_outputs(out, buffers, {}, ops=[], ms=ms, **self.rep_parts())

    def op_empty_rep(self, buffers: list | None, like: list, slot: int = 0, content: int = 0) -> None:
        """A rep with no call but the same input load, flush and hand-over of outputs shaped `like`
        (shapes and dtypes, never the reference's values): the judge's wall-clock and CPU-time
        yardstick. (Loading GBs of inputs can take longer than the call; a yardstick without it made
        honest calls on big inputs look too fast.) The stand-in outputs are made once, as a real
        rep's outputs are made inside its timed call."""
        import torch

        self.load_slot(slot, content)
        self.timer.flush()
        ms, _ = self.timer.time_ms(lambda: None)
        if self.empty_like != like:
            self.empty_like = like
            self.empty_outputs = [torch.zeros(shape, dtype=getattr(torch, dtype), device=self.device) for shape, dtype in like]
        self._send_outputs(self.empty_outputs, buffers, {}, ops=[], ms=ms, **self.rep_parts())

    def rep_parts(self) -> dict:
        """What the judge needs of a rep besides its time: its parts (the whole window, the judge's
        tamper evidence; the spin, the call and the tail; Timer._time_queued), and a benchmark's trace
        (timing.TRACE_ENV) for the judge to write down (this process writes nowhere outside its workdir)."""
        parts = {"parts": self.timer.last_parts} if self.timer.last_parts else {}
        if not self.timer.trace:
            return parts
        self.snapshot.allow_threads(self.timer.profiler_threads)  # the trace's profiler sessions', not the candidate's
        return {**parts, "trace": self.timer.last_trace}

    def load_slot(self, slot: int, content: int) -> list:
        import torch

        inputs = self.timing_slots[slot]
        for dst, src in zip(inputs, self.timing_sources[content]):
            if isinstance(dst, torch.Tensor):
                dst.copy_(src)
        return inputs

    def op_paper(self) -> None:
        """The paper's timing (profiler kernel time, 5 warm-up + 10 calls on one input set, no flush).
        The results of the timed calls are kept (as many as fit PAPER_KEEP_BYTES, the last ones) for
        the judge to check one by one (`paper_output`). The profiler's own threads are told apart
        from the candidate's (`profile_calls`) and no longer count as new."""
        import torch

        from cudagym.eval.checks import as_tensor_list
        from cudagym.eval.integrity import thread_ids
        from cudagym.eval.timing import PAPER_REPS, profile_calls

        inputs = self.load_slot(0, 0)
        with torch.no_grad():
            first = as_tensor_list(self.model(*inputs))
            size = sum(t.numel() * t.element_size() for t in first)
            del first
            keep = max(1, min(PAPER_REPS, PAPER_KEEP_BYTES // max(1, size)))
            ms, kept, profiler_threads = profile_calls(lambda: self.model(*inputs), keep=keep,
                                                       census=lambda: thread_ids()[1])
        self.snapshot.allow_threads(profiler_threads)
        self.paper_outputs = kept
        self.reply(ok=True, ms=ms, kept=len(kept), flags=self.snapshot.changes())

    def op_paper_output(self, index: int, buffers: list | None) -> None:
        """Hand over the result of timed call `index` of the last `paper` timing."""
        self._send_outputs(self.paper_outputs[index], buffers, {}, ops=[])

    def op_integrity(self) -> None:
        self.reply(ok=True, flags=self.snapshot.changes())

    # -- helpers ----------------------------------------------------------------------------------
    def _send_outputs(self, out, buffers: list | None, flags: dict, ops: list, **extra) -> None:
        import torch

        from cudagym.eval.checks import as_tensor_list, structure_mismatch

        try:
            outs = as_tensor_list(out)
        except TypeError as exc:
            return self.reply(ok=False, status="incorrect", reason=str(exc), flags=flags)
        if buffers is None:  # CPU: results travel by value, in a format the judge loads without unpickling
            payload = io.BytesIO()
            torch.save([t.detach().clone() for t in outs], payload)
            self.reply(ok=True, flags=flags, ops=ops, n_bytes=payload.tell(), **extra)
            self.conn.send_bytes(payload.getvalue())
            return
        mismatch = structure_mismatch(outs, buffers)
        if mismatch:
            return self.reply(ok=False, status="incorrect", reason=mismatch, flags=flags)
        for buf, t in zip(buffers, outs):
            buf.copy_(t)
        self.timer.sync()
        self.reply(ok=True, flags=flags, ops=ops, **extra)


def write_candidate_files(root: str, files: dict) -> None:
    """The candidate's module and extra files (an agent's kernels/) at their relative paths, where the
    candidate finds them through `__file__`. The driver checked the names already; a name that would
    land outside `root` is refused here too."""
    base = os.path.realpath(root)
    for name, text in files.items():
        target = os.path.realpath(os.path.join(base, name))
        if os.path.isabs(name) or not target.startswith(base + os.sep):
            raise ValueError(f"candidate file {name!r} is outside the candidate's folder")
        os.makedirs(os.path.dirname(target), exist_ok=True)
        try:
            with open(target) as f:
                if f.read() == text:
                    continue  # unchanged: its mtime stays, and a build from it stays up to date
        except (OSError, UnicodeDecodeError):
            pass
        scratch = f"{target}.{os.getpid()}.tmp"  # judges of the same candidate may write at once
        with open(scratch, "w") as f:
            f.write(text)
        os.replace(scratch, target)


def _input_writes(passed: list, pristine: list) -> dict:
    """`input_mutation` if the call changed an input. (Returning an input's buffer unchanged is
    fine: a reference may return a view of its input.)"""
    import torch

    details = [f"input {i} changed" for i, (x, p) in enumerate(zip(passed, pristine))
               if isinstance(x, torch.Tensor) and not torch.equal(x, p)]
    return {"input_mutation": details} if details else {}


def clone_inputs(inputs: list) -> list:
    """Fresh copies of the tensors (memory this process owns); other inputs are immutable values."""
    return [x.clone() if hasattr(x, "clone") else x for x in inputs]


PAPER_KEEP_BYTES = 2 * 2**30  # results of paper-timed calls kept for the judge to check


def set_fp32_precision(precision: str = "strict") -> None:
    """The precision every party (reference, baselines, candidate) computes fp32 in.
    strict: TF32 and reduced-precision reductions off, fp32 means fp32. kernelbench: torch's own
    defaults, as KernelBench's baseline loop leaves them (cuDNN convolutions in TF32, matmuls not)."""
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = precision == "kernelbench"
    torch.set_float32_matmul_precision("highest")


def warm_up(device: str, profiler: bool = False) -> None:
    """Create the handles and thread pools torch makes lazily, so the thread snapshot includes them;
    with `profiler` (paper timing, a benchmark's trace), also the profiler's (CUPTI starts threads on first use)."""
    import torch
    import torch.nn.functional as F

    x = torch.randn(256, 256, device=device)
    y = (x @ x).relu().sum(dim=0)
    F.conv2d(torch.randn(1, 3, 16, 16, device=device), torch.randn(4, 3, 3, 3, device=device))
    torch.cumsum(y, 0)
    # First use of the guard imports dispatch machinery that rebinds a few torch attributes, and
    # torch.save caches __slotnames__ on Tensor: both happen here, before the snapshot.
    from cudagym.eval.guard import OpRecord, make_guard

    with make_guard(OpRecord()):
        torch.relu(x)
    torch.save([x[:1].clone()], io.BytesIO())
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        if profiler:
            from cudagym.eval.timing import profile_calls

            profile_calls(lambda: torch.relu(x), warmup=1, reps=2)


def main(argv: list[str]) -> int:
    from multiprocessing.connection import Connection

    from cudagym.tasks.sandbox import die_with_parent, drop_capabilities, isolate, kill_session_when_gone

    die_with_parent(int(os.environ["CUDAGYM_JUDGE_PID"]))
    kill_session_when_gone()  # this process's compilers die with it (before torch: a small fork, no threads yet)
    fd, workdir, writable = int(argv[1]), argv[2], argv[3:]
    sandbox = isolate(workdir, writable) if os.environ.get("CUDAGYM_SANDBOX", "1") != "0" else "off"
    if sandbox != "off":  # the mounts are made: nothing the candidate does may change them back
        kept = drop_capabilities()
        if kept and sandbox == "full":
            sandbox = f"partial: {kept}"
    os.chdir(workdir)
    os.environ["TMPDIR"] = tempfile.tempdir = workdir
    Runner(Connection(fd), sandbox).serve()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
