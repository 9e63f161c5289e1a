"""The judge: one process per (reference, candidate) that runs the reference and decides the verdict.

Started by the driver (`cudagym.eval.evaluate`) as `python -m cudagym.eval.judge REQUEST.json`;
it isolates itself like any process running task code, then:
1. builds Model with weights from a per-run secret seed, and starts the candidate's runner
   (`cudagym.eval.runner`), which gets Model's state_dict;
2. for each of n_checks fresh input sets (secret seeds) computes the reference output here, sends
   the candidate a copy of the inputs, and compares what comes back: exact type, dtype, shape,
   device, finite, tolerance; inputs bit-identical afterwards; degenerate-problem and precision
   checks; the runner's guard and integrity flags;
3. times the candidate (runner) and the eager reference (here) interleaved, rep by rep, with the
   GPU held exclusively; every timed call hands its output over in the same round trip and is
   checked, and the judge's own wall clock bounds what the candidate may report;
4. writes the verdict fields as JSON to the result path.
Standard library and torch only (it runs on GPU boxes with nothing else).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import gc
import hashlib
import importlib
import json
import os
import pickle
import random
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import types
from dataclasses import dataclass

import torch

from cudagym.eval import checks
from cudagym.eval.evaluate import PHASE_FILE
from cudagym.eval.feed import END_MARK, item_path
from cudagym.eval.gpulock import (AdmissionDeferred, build_folder_lock, claim_task, compile_claim, device_lock_path,
                                  gpu_lock, lower_reservation, memory_reservation, on_cpus)
from cudagym.eval.guard import OpRecord, make_guard, short_name
from cudagym.eval.runner import clone_inputs, set_fp32_precision
from cudagym.eval.verdict import EDGE_ROUNDS, near_milestone
from cudagym.eval.timing import (PAPER_REPS, Timer, adaptive_reps, median_noise_ms, process_cpu_clock, timer_method,
                                 profiler_kernel_ms, summarize, tamper_evidence, thread_cpu_clock, time_floors,
                                 write_trace)
from cudagym.tasks import sha256_text
from cudagym.tasks.sandbox import MemoryWatchdog, describe_exit, kill_tree

TIMING_INPUT_BUDGET_BYTES = 4 * 2**30  # rotated timing input sets share this much memory
FP64_LIMIT_BYTES = 2 * 2**30  # skip the float64 reference above this input size
# A queued rep's spin, call and tail add up to its whole window (all five events on the GPU's clock;
# elapsed_time resolves about 0.5 us): beyond this the numbers were not measured.
PARTS_SLACK, PARTS_SLACK_MS = 0.001, 0.003
# A timed rep's tail (its call's end to the device-wide synchronisation) may pass an empty rep's by this much.
TAIL_MARGIN_MS, TAIL_FACTOR = 0.05, 1.0
CONFIRM_REPS = 20  # empty and timed reps in turn that must show a tampered timer again before it is flagged
EDGE_KEEP_BYTES = 64 * 2**20  # timing sets up to this size stay allocated while a round's fresh ones are made
FP64_CHECKS = 2  # checks that also compare against the float64 reference (it is slow for convolutions)


class CandidateFailed(Exception):
    """Ends the evaluation with a verdict (status, reason, flags)."""

    def __init__(self, status: str, reason: str, flags: dict | None = None, trace: str | None = None):
        super().__init__(reason)
        self.status, self.reason, self.flags, self.trace = status, reason, flags or {}, trace


@dataclass
class Request:
    mode: str  # "eval" | "baseline" | "warm" (compile only) | "audit" | "filter" (a synthesized task's fitness)
    # | "filter-check" (the filter without its timing: a GPU filter's first pass, see synth.filter.run_filter)
    # | "filter-time" (its timing without the checks: the second pass, for the tasks the first passed)
    # | "filter-probe" (eager time only, roughly: the dataset build's scale search, `probe_task`)
    ref_code: str
    workdir: str
    candidate_code: str | None = None
    candidate_files: dict | None = None  # relative path -> text, written beside candidate.py (an agent's kernels/)
    device: str = "cpu"
    policy: str = "strict"
    n_checks: int = 5
    atol: float = 1e-2
    rtol: float = 1e-2
    timing_mode: str = "strict"
    time_candidate: bool = True
    eager_baseline: bool = True  # time eager live, interleaved with the candidate
    compile_baseline: bool = False  # also time torch.compile (cached by the driver otherwise)
    call_timeout_s: float = 120.0
    init_timeout_s: float = 600.0  # includes building the candidate's extension
    runner_memory_bytes: int = 32 * 2**30
    gpu_memory_fraction: float | None = None
    lock_path: str | None = None  # explicit lock file; else the device's file in lock_dir (gpulock.device_lock_path)
    lock_dir: str | None = None
    precision: str = "strict"  # runner.set_fp32_precision
    exclusive: bool = False  # hold the GPU alone throughout (a retry after running out of memory beside others)
    writable: tuple = ()
    min_reps: int = 10
    max_reps: int = 100
    max_timing_s: float = 10.0
    seed: int | None = None  # tests only; normally a fresh secret per run
    # A judge of several baseline or compile tasks: how long one task whose share is over half the memory
    # budget waits for admission before it is deferred (result "deferred"; run again at the end of the
    # list). None: it waits as long as it takes.
    defer_memory_s: float | None = None
    ref_codes: list | None = None  # reference modes only: several tasks in one process (imports paid once)
    # A queue shared by the judges of a pass (gpulock.task_queue): each has the pass's whole list, and runs a
    # task only once it has claimed it (claim_keys[i] with its claim_token); a task another judge took is a
    # line {"claimed_elsewhere": true}.
    queue: str | None = None
    claim_keys: list | None = None
    claim_token: str = ""
    # A feed (cudagym.eval.feed): long-lived judges that take tasks as the driver adds them, numbered item files
    # in this folder, claimed as a queue's are; the judge ends when it has seen every item and the driver's end
    # mark. Each result line carries its item's key ("feed_key").
    feed: str | None = None
    timing_cpus: tuple = ()  # cores this GPU's exclusive-lock holder times on (gpulock.timing_cpu_split)
    work_cpus: tuple = ()  # cores for everything else
    slow_call_s: float | None = None  # filter modes: a first and a warm reference call slower than this end the measurement
    # filter-probe: an eager time (ms) under this, timed under the shared GPU lock, is the probe's answer
    # without a timing turn of its own (`probe_task`); None: every probe times with the GPU alone
    fast_ms: float | None = None
    known_compile_ms: float | None = None  # eval: the stored compile baseline (no live one), for the milestone-edge test
    edge_band: float = 0.0  # eval: a speedup this close to a milestone is timed in EDGE_ROUNDS rounds (verdict.EDGE_BAND)


# -- reference side ---------------------------------------------------------------------------------
def load_reference(code: str) -> types.ModuleType:
    module = types.ModuleType("reference")
    module.__file__ = "reference.py"
    exec(compile(code, "reference.py", "exec"), module.__dict__)
    for name in ("Model", "get_inputs", "get_init_inputs"):
        if not hasattr(module, name):
            raise ValueError(f"reference defines no {name}")
    return module


def make_inputs(ref: types.ModuleType, seed: int, device: str) -> list:
    """get_inputs() under a seed, built on the device directly (generating on CPU is ~30x slower)."""
    torch.manual_seed(seed)
    with torch.device(device):
        inputs = list(ref.get_inputs())
    return [x.to(device) if isinstance(x, torch.Tensor) else x for x in inputs]


def widened(inputs: list, seed: int) -> list:
    """The same inputs drawn from a wider domain (signed, same scale), to expose trivial answers
    that only pass on the problem's own domain (ReLU of torch.rand is the identity)."""
    gen = torch.Generator(device=next((x.device for x in inputs if isinstance(x, torch.Tensor)), "cpu"))
    gen.manual_seed(seed)
    out = []
    for x in inputs:
        if isinstance(x, torch.Tensor) and x.is_floating_point() and x.numel() > 1:
            scale = float(x.abs().mean(dtype=torch.float64)) or 1.0
            out.append(torch.randn(x.shape, generator=gen, device=x.device, dtype=x.dtype) * scale)
        else:
            out.append(x)
    return out


# Region checks (Evaluation.region_check): input sets with one secret region amplified.
# "gentle": the smallest amplification that moves the output (a sampled loss misses or overweights
# the region); "strong": the largest that keeps the reference finite and well conditioned (a
# statistic estimated from a sample, a row mean, moves every output a little: only a large
# amplification moves it beyond fp32 noise everywhere).
REGION_STRENGTHS = ("gentle", "strong")
REGION_SCALES = (2.0, 8.0, 64.0, 512.0, 4096.0, 32768.0)
REGION_MIN_CHANGE = 0.02  # the output must move by this much (rel. L2), far above fp32 noise
REGION_STRONG_MOVED = 0.01  # a strong check's amplification moves at least this fraction of the outputs, if any does
REGION_CHANGE_TOL = 0.25  # each output's change must match the reference's to this fraction (+ a tenth of the tolerance)
REGION_FP64_TOL = 1e-3  # the amplified set is kept only where fp32 reference and float64 agree this well


def find_region(model, inputs: list, rng: random.Random, model64=None, strongest: bool = False,
                tol: checks.Tolerance = checks.Tolerance()):
    """A region of one input (a single element, else a slab: one index along one dim) whose
    amplification moves the reference's output by REGION_MIN_CHANGE while it stays finite and well
    conditioned (fp32 and float64 references agree): the smallest such amplification, or with
    `strongest` the smallest that also moves REGION_STRONG_MOVED of the outputs by more than a fifth
    of the tolerance (else the largest there is). Returns (description, a context manager that
    amplifies it in place, reference outputs on the plain and on the amplified inputs), or None."""
    candidates = [(i, x) for i, x in enumerate(inputs)
                  if isinstance(x, torch.Tensor) and x.is_floating_point() and x.numel() > 1 and bool(x.ne(0).any())]
    if not candidates:
        return None
    ref_base = run_reference(model, inputs)
    if not all(r.is_floating_point() for r in ref_base) or checks.non_finite(ref_base):
        return None
    weights = [x.numel() for _, x in candidates]
    i, x = rng.choices(candidates, weights=weights)[0]  # mostly the big tensor: the one a kernel would sample
    element = tuple(rng.randrange(n) for n in x.shape)
    dims = [d for d in range(x.dim()) if x.shape[d] > 1]
    dim = rng.choice(dims) if dims else 0
    slab = tuple(slice(None) if d != dim else element[d] for d in range(x.dim()))
    regions = [(f"input {i}{list(element)}", element), (f"input {i}[index {element[dim]} of dim {dim}]", slab)]
    for label, index in regions:
        found = None
        for scale in REGION_SCALES:
            amplify = _amplifier(x, index, scale)
            ref_amp = None  # the last scale's outputs are freed before the next are computed
            try:
                with amplify():
                    ref_amp = run_reference(model, inputs)
                    if checks.non_finite(ref_amp):
                        break
                    if checks.rel_l2(ref_amp, ref_base) < REGION_MIN_CHANGE:
                        continue
                    ref64 = reference_fp64(model64(), inputs) if model64 is not None else None
            except Exception:  # undefined there (an index out of range, a failed factorisation), or an
                break          # input whose elements share memory (an expanded tensor) cannot be written
            if ref64 is not None and checks.rel_l2(ref_amp, ref64) > REGION_FP64_TOL:
                break  # ill-conditioned at this amplitude: an honest fp32 kernel could not be held to it
            del ref64
            found = (f"{label} x{scale:g}", amplify, ref_base, ref_amp)
            if not strongest or moved_fraction(ref_amp, ref_base, tol) >= REGION_STRONG_MOVED:
                break
        if found is not None:
            return found
    return None


def moved_fraction(ref_amp: list[torch.Tensor], ref_base: list[torch.Tensor], tol: checks.Tolerance) -> float:
    """The fraction of output elements an amplification moved by more than a fifth of the tolerance."""
    moved = total = 0
    for a, b in zip(ref_amp, ref_base):
        moved += int(((a - b).abs_() > a.abs().mul_(tol.rtol / 5).add_(tol.atol / 5)).sum())
        total += a.numel()
    return moved / max(1, total)


def _amplifier(x: torch.Tensor, index, scale: float):
    """A context manager that multiplies x[index] by scale in place (zeros become scale x mean |x|,
    keeping the sign of the domain) and restores it afterwards."""
    @contextlib.contextmanager
    def amplify():
        saved = x[index].clone()
        typical = float(x.abs().mean(dtype=torch.float64)) or 1.0
        x[index] = torch.where(saved == 0, torch.full_like(saved, typical), saved) * scale
        try:
            yield
        finally:
            x[index] = saved
    return amplify


def nbytes(items) -> int:
    return sum(x.numel() * x.element_size() for x in items if isinstance(x, torch.Tensor))


def run_reference(model, inputs: list) -> list[torch.Tensor]:
    with torch.no_grad():
        return checks.as_tensor_list(model(*clone_inputs(inputs)))


def reference_fp64(model64, inputs: list) -> list[torch.Tensor] | None:
    """The reference in float64, the yardstick for precision; None where it cannot be had."""
    if nbytes(inputs) > FP64_LIMIT_BYTES or not any(isinstance(x, torch.Tensor) and x.dtype == torch.float32 for x in inputs):
        return None
    try:
        inputs64 = [x.double() if isinstance(x, torch.Tensor) and x.dtype == torch.float32 else x for x in inputs]
        with torch.no_grad():
            return checks.as_tensor_list(model64(*inputs64))
    except Exception:
        return None


def footprint_bytes(ref: types.ModuleType, init_args: list, mode: str = "eval") -> int:
    """What one judge may hold on the GPU. An evaluation, judge and runner together: input sets for
    checks, widened checks, float64 checks and timing, their outputs, weights, and two CUDA contexts.
    A baseline's judge holds two to four timing sets, their eager outputs and the compiled model's;
    a compile-only (`warm`) judge one set and a call's outputs. Charged the evaluation's 14x the inputs,
    v0.1's multi-GB L1 problems were admitted two at a time at most; a cold baseline run on the H200
    stood almost still for two minutes while they were under way. The dataset filter's judges run the
    reference alone, so theirs is counted from what its forward allocates (`filter_footprint_bytes`)."""
    try:
        with torch.device("meta"):
            model = ref.Model(*init_args)
            weights = nbytes(list(model.parameters()) + list(model.buffers()))
        inputs = make_inputs(ref, 0, "meta")
    except Exception:
        return 8 * 2**30
    if mode in FILTER_SETS:
        traced = filter_footprint_bytes(model, inputs, weights, mode)
        if traced is not None:
            return traced
    input_factor, weight_factor = FOOTPRINT_FACTORS.get(mode, FOOTPRINT_FACTORS["eval"])
    return input_factor * nbytes(inputs) + weight_factor * weights + CONTEXT_BYTES


# (times the inputs, times the weights) a judge of each mode may hold; other modes as an evaluation
FOOTPRINT_FACTORS = {"eval": (14, 4), "baseline": (8, 2), "warm": (4, 2), "filter-probe": (4, 2)}

# The dataset filter's modes: (input sets, output sets) a judge holds besides the weights and one forward's
# own allocations. Checks and timing (`_measure_task`): sets a and b and the copy every reference call
# makes of its inputs (`run_reference`), the reference's outputs for b, the compiled model's, and a
# comparison's difference and float64 norm. A probe (`probe_task`): one set and its copy, the outputs of
# the call before the one being timed. Fitted on the H100 (session 29, 95 tasks, benchmarks/NOTES.md):
# the most each judge allocated over weights + 3 inputs + 4 outputs + the forward's peak had median 1.00,
# p75 1.04; with 2 input sets, median 1.17 and 41 of 95 over 1.25x.
FILTER_SETS = {"filter": (3, 4), "filter-check": (3, 4), "filter-probe": (2, 2),
               # A timing task (a GPU filter's pass 2, `_measure_task` checked): sets a and b, which the eager
               # and compiled calls take as they are (no reference call's copy), the output of the call being
               # made and of the one before it; no checks' outputs or comparisons. Charged as a check task
               # until session 34, timing tasks reserved a median 6.6-9.0 GiB against 2.9 GiB held (H100),
               # 2-3x, where check tasks reserved 1.8x, and waited for memory half their waiting time.
               "filter-time": (2, 2),
               # a check task's compile, after its checks (`_check_and_compile`): set b, which the compiled
               # model's first call runs on, and the reference's outputs for it; the call's own are in the peak
               "filter-compile": (1, 1)}
# Over what the meta forward counts: the caching allocator's rounding and cached blocks, a library's
# workspace (cuDNN, cuBLAS) that meta tensors do not show (FILTER_MARGIN); the timer's L2 flush buffer
# (128-256 MiB) and small tasks' fixed costs (up to 160 MiB allocated on the H100 for tasks of a few MiB)
# (FILTER_FIXED_BYTES). A judge that still runs out of memory beside others runs again alone.
FILTER_MARGIN = 1.25
FILTER_FIXED_BYTES = 256 * 2**20
# A filter judge is one process, its CUDA context alone (no runner beside it): 610-836 MiB each on the
# H100 (torch 2.11, session 29, every process's use sampled through a build), against an evaluation's two.
FILTER_CONTEXT_BYTES = 2**30


def filter_footprint_bytes(model, inputs: list, weights: int, mode: str) -> int | None:
    """A dataset filter judge's footprint from one eager forward on meta tensors (`footprint.forward_bytes`:
    the outputs, and the most its allocations hold at once): weights, its input and output sets, that peak
    and the fixed costs, FILTER_MARGIN over all, and its CUDA context. None where the forward does not run
    on meta tensors (a data-dependent op): the caller charges its factors."""
    from cudagym.eval.footprint import forward_bytes

    try:
        outputs, peak = forward_bytes(model, inputs)
    except Exception:
        return None
    n_inputs, n_outputs = FILTER_SETS[mode]
    held = weights + n_inputs * nbytes(inputs) + n_outputs * outputs + peak + FILTER_FIXED_BYTES
    return int(FILTER_MARGIN * held) + FILTER_CONTEXT_BYTES


CONTEXT_BYTES = 2 * 2**30  # a judge's and its runner's CUDA contexts, handles and warm-up


def memory_share(footprint: int, budget: int, exclusive: bool) -> tuple[int, int]:
    """(the ledger share a judge reserves, the device memory that must be free before it starts): its
    footprint, or for a rerun after running out of memory (`exclusive`) the whole budget, both."""
    share = budget if exclusive else footprint
    return share, min(share, budget)


# Neither of these creates a CUDA context in the calling process (device properties, and NVML for what
# is in use): a judge asks them while it waits for admission, when it must hold no GPU memory.
def memory_budget_bytes(device: str) -> int:
    return int(0.85 * torch.cuda.get_device_properties(device).total_memory) if device.startswith("cuda") else 0


def device_free_bytes(device: str) -> int:
    """The device's free memory as the driver sees it (every process's use); through NVML, so without
    a context of our own. Without NVML (no pynvml), the CUDA runtime's answer, which makes one."""
    try:
        return torch.cuda.get_device_properties(device).total_memory - torch.cuda.device_memory_used(device)
    except Exception:
        return torch.cuda.mem_get_info(device)[0]


def task_dtypes(ref: types.ModuleType, init_args: list) -> set[str]:
    """Dtypes the task itself uses: parameters, buffers and inputs, built on the meta device."""
    tensors = []
    try:
        with torch.device("meta"):
            model = ref.Model(*init_args)
        tensors += list(model.parameters()) + list(model.buffers())
        tensors += [x for x in make_inputs(ref, 0, "meta") if isinstance(x, torch.Tensor)]
    except Exception:
        pass
    return {str(t.dtype).replace("torch.", "") for t in tensors} | {"float32"}


# -- the runner connection --------------------------------------------------------------------------
def candidate_key(code: str | None, files: dict | None) -> str:
    """A build directory name for a candidate: its code and its extra files, so an edited kernel file rebuilds."""
    digest = hashlib.sha256((code or "").encode())
    for name in sorted(files or {}):
        digest.update(b"\0" + name.encode() + b"\0" + files[name].encode())
    return digest.hexdigest()[:16]


class RunnerProcess:
    """The candidate's process, spoken to over a socket pair. Every reply is JSON (plus torch.save
    bytes for CPU outputs, loaded with weights_only); nothing the candidate sends is unpickled."""

    def __init__(self, req: Request):
        from multiprocessing.connection import Connection

        self.req = req
        self.cuda = req.device.startswith("cuda")
        if self.cuda:
            import torch.multiprocessing  # noqa: F401  (registers CUDA IPC reductions)
            from multiprocessing.reduction import ForkingPickler

            self._dumps = ForkingPickler.dumps
        else:
            self._dumps = pickle.dumps
        parent, child = socket.socketpair()
        workdir = os.path.join(req.workdir, "candidate")
        os.makedirs(workdir, exist_ok=True)
        # The candidate writes only its own build directory (keyed by its code, so a re-run reuses the
        # build), never the shared caches: a planted library there would be loaded by later candidates.
        self.ext_dir = ext_dir = os.path.join(os.environ.get("TORCH_EXTENSIONS_DIR", os.path.join(req.workdir, "ext")),
                                              "candidate-" + candidate_key(req.candidate_code, req.candidate_files))
        os.makedirs(ext_dir, exist_ok=True)
        env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", TMPDIR=workdir, TORCH_EXTENSIONS_DIR=ext_dir,
                   CUDAGYM_JUDGE_PID=str(os.getpid()),  # the runner dies with this judge (sandbox.die_with_parent)
                   TRITON_CACHE_DIR=os.path.join(workdir, "triton"), TORCHINDUCTOR_CACHE_DIR=os.path.join(workdir, "inductor"))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "cudagym.eval.runner", str(child.fileno()), workdir, ext_dir],
            pass_fds=[child.fileno()], env=env, cwd=workdir, start_new_session=True,
            stdout=open(os.path.join(workdir, "stdout.log"), "wb"), stderr=subprocess.STDOUT)
        child.close()
        self.conn = Connection(parent.detach())
        self.watchdog = MemoryWatchdog(self.proc.pid, req.runner_memory_bytes).__enter__()

    def load(self, timeout_s: float, **msg) -> dict:
        """The candidate's import, which builds its extension: within timeout_s in all, waiting included,
        while this judge holds the build folder (gpulock.build_folder_lock). The lock is taken here, in the
        trusted judge, not by the candidate's process, and the judge holding it is what makes a baton
        left in the folder a killed build's: other judges of the same code wait, then reuse the build."""
        deadline = time.monotonic() + timeout_s
        with contextlib.ExitStack() as held:
            try:
                held.enter_context(build_folder_lock(self.ext_dir, timeout_s))
            except TimeoutError:
                raise CandidateFailed("timeout", f"candidate did not load within {timeout_s:.0f} s: it was waiting "
                                      "for another build of the same candidate") from None
            return self.request(max(0.0, deadline - time.monotonic()), op="load", **msg)

    def request(self, timeout_s: float, **msg) -> dict:
        self.conn.send_bytes(self._dumps(msg))
        return self._receive(timeout_s, what=msg["op"])

    def _receive(self, timeout_s: float, what: str) -> dict:
        if not self.conn.poll(timeout_s):
            self.close(graceful=False)
            raise CandidateFailed("timeout", f"candidate did not answer '{what}' within {timeout_s:.0f} s")
        try:
            reply = json.loads(self.conn.recv_bytes())
        except (EOFError, ConnectionResetError, OSError):
            self.proc.wait(timeout=10)
            if self.watchdog.fired:
                raise CandidateFailed("runtime_error", f"candidate exceeded the memory limit ({self.req.runner_memory_bytes >> 20} MiB)")
            raise CandidateFailed("runtime_error", f"candidate process died during '{what}' ({describe_exit(self.proc.returncode)})"
                                  f"{self._log_tail()}")
        except (ValueError, UnicodeDecodeError):
            raise CandidateFailed("rejected", f"malformed reply from the candidate's process during '{what}'",
                                  {"protocol_tamper": ["reply is not JSON"]})
        flags = reply.get("flags", {}) if isinstance(reply, dict) else None
        if not isinstance(flags, dict) or not all(isinstance(k, str) and isinstance(v, list) for k, v in flags.items()):
            raise CandidateFailed("rejected", f"malformed reply from the candidate's process during '{what}'",
                                  {"protocol_tamper": ["reply is not a well-formed object"]})
        if not reply.get("ok"):
            raise CandidateFailed(reply.get("status") if reply.get("status") in ("compile_error", "runtime_error", "incorrect")
                                  else "runtime_error", str(reply.get("reason", "failed"))[:500], reply.get("flags") or {},
                                  trace=str(reply.get("trace", ""))[-2000:] or None)
        return reply

    def receive_outputs(self, timeout_s: float) -> list[torch.Tensor]:
        """CPU outputs by value: torch.load(weights_only=True) admits tensors and containers only."""
        import io

        if not self.conn.poll(timeout_s):
            raise CandidateFailed("timeout", "candidate did not send its outputs")
        try:
            outs = torch.load(io.BytesIO(self.conn.recv_bytes()), weights_only=True)
        except Exception:  # anything but a torch.save of tensors: someone else wrote on the channel
            outs = None
        if not isinstance(outs, list) or any(type(t) is not torch.Tensor for t in outs):
            raise CandidateFailed("rejected", "candidate sent something other than tensors", {"protocol_tamper": ["outputs"]})
        return outs

    def _log_tail(self) -> str:
        try:
            with open(os.path.join(self.req.workdir, "candidate", "stdout.log"), "rb") as f:
                lines = [ln for ln in f.read()[-4000:].decode(errors="replace").splitlines() if ln.strip()]
            return f": {lines[-1][:300]}" if lines else ""
        except OSError:
            return ""

    def close(self, graceful: bool = True) -> None:
        """Ask the runner to exit (a hung one is not asked), then make sure it and its children are gone."""
        try:
            if graceful and self.proc.poll() is None:
                self.conn.send_bytes(pickle.dumps({"op": "exit"}))
                self.proc.wait(timeout=5)
        except Exception:
            pass
        kill_tree(self.proc.pid)
        self.proc.wait()
        self.watchdog.__exit__(None, None, None)


# -- the evaluation ---------------------------------------------------------------------------------
class Evaluation:
    def __init__(self, req: Request):
        self.req = req
        self.tol = checks.Tolerance(req.atol, req.rtol)
        self.rng = random.Random(req.seed if req.seed is not None else secrets.randbits(64))
        self.flags: dict[str, list[str]] = {}
        self.info: dict = {}
        self.ref = load_reference(req.ref_code)
        self.init_args = list(self.ref.get_init_inputs())
        self.init_seed = self.rng.getrandbits(63)
        self.model = None
        self._constructed = None  # construct_model's CPU build, until build_model moves it to the device
        self._model64 = None
        self.share_bytes: int | None = None  # this evaluation's share of the GPU memory budget, once reserved
        self.lowered_bytes: int | None = None  # the share it held after lower_share, where it lowered it

    @contextlib.contextmanager
    def reservation(self):
        """This evaluation's share of the GPU memory budget (its footprint, CUDA contexts included),
        held until it ends. The judge's CUDA context is made only once admitted (set_device): a judge
        waiting for the GPU holds none of its memory. On the H200, 35 waiting judges holding their
        contexts (~1-4 GB each) left a 100 GB problem's judge too little, whatever the ledger said."""
        if not self.req.device.startswith("cuda"):
            yield
            return
        device = self.req.device
        budget = memory_budget_bytes(device)
        # A rerun after an OOM takes the whole budget: it waits until no other judge holds GPU memory
        # (judges waiting for the exclusive lock keep theirs, so the lock alone would not free any), and
        # until the device has the whole budget free: its footprint was already too small once. On the
        # H200 (session 12) a 100 GB RMSNorm judge, which needs ~120 GB, ran out of memory beside another
        # process's 23.6 GB: a rerun that waits only for its (low) footprint to be free can meet the same.
        share, need_free = memory_share(footprint_bytes(self.ref, self.init_args, self.req.mode), budget,
                                        self.req.exclusive)
        # A large share that does not fit now waits for the judges holding memory, and after FAIR_AFTER_S
        # everyone who came after it waits too. In the H200's cold baseline run (session 18) L1/45 (130
        # GiB) waited 188 s behind two compile judges' 2-3 minute DenseNet compiles, and the three other
        # timing judges queued behind it, storing nothing for two minutes. Deferred, it is timed last.
        give_up = self.req.defer_memory_s if share > budget // 2 else None
        self.share_bytes = share
        with memory_reservation(self.req.lock_path, share, budget, give_up_s=give_up,
                                free_bytes=lambda: device_free_bytes(device), need_free_bytes=need_free):
            torch.cuda.set_device(device)
            yield

    def lower_share(self, mode: str) -> None:
        """Lower this evaluation's share of the GPU memory budget to `mode`'s footprint, for what is left
        of it holding less than before (never raising it, `gpulock.lower_reservation`). The memory
        freed goes back to the device first: the ledger admits other judges into it at once. An
        exclusive rerun (out of memory once already) keeps the whole budget."""
        if self.share_bytes is None or self.req.exclusive or not self.req.device.startswith("cuda"):
            return
        share = footprint_bytes(self.ref, self.init_args, mode)
        if share >= (self.lowered_bytes or self.share_bytes):
            return
        gc.collect()
        torch.cuda.empty_cache()
        self.lowered_bytes = lower_reservation(self.req.lock_path, share)

    def build_model(self, on_device: bool = False) -> None:
        """Model with weights from the secret seed, on the device (under the GPU lock). on_device: its
        weights drawn on the device itself, not drawn on the CPU and copied, for a model whose values
        only its own judge uses (a baseline's, a compile judge's): initialising L3/2's 2.1 G parameters
        on the CPU took 12-16 s in each of its two judges on the H200, under the shared GPU lock, so
        every timing turn waited for it. Values differ from a CPU build (another generator), not times."""
        device = self.req.device
        if on_device and device != "cpu":
            torch.manual_seed(self.init_seed)
            try:
                with torch.device(device):
                    self.model = self.ref.Model(*self.init_args).to(device)
                return
            except Exception:  # an __init__ that needs CPU tensors (.numpy(), ...): the usual build
                self.model = None
        self.construct_model()
        self.model, self._constructed = self._constructed.to(device), None

    def construct_model(self) -> None:
        """The model with weights from the secret seed, on the CPU (where `build_model` finds it and
        moves it to the device): for a caller that builds it before taking the GPU lock, which a CPU
        build does not need. Under the shared lock, a large model's CPU initialisation held it for
        seconds, and with a timer queued no other judge got in meanwhile: on the H100 (session 35) the
        filter's shared holds summed 609 judge-seconds in a 424 s call, 45% of it building models and
        inputs, and for 149 s one reader held the lock alone while timers waited. Each call of
        `build_model` takes a model built here once, or builds one itself."""
        if self._constructed is None:
            torch.manual_seed(self.init_seed)
            self._constructed = self.ref.Model(*self.init_args)

    def model64(self):
        if self._model64 is None:
            self._model64 = copy.deepcopy(self.model).double()
        return self._model64

    def new_seed(self) -> int:
        return self.rng.getrandbits(63)

    def add_flags(self, flags: dict | None) -> None:
        for name, details in (flags or {}).items():
            self.flags.setdefault(name, [])
            self.flags[name] += [d for d in details if d not in self.flags[name]]

    def call_candidate(self, runner: RunnerProcess, inputs: list, ref: list[torch.Tensor], guard: bool):
        """Candidate's outputs for `inputs` (shared copy), and whether it mutated that copy."""
        shared = clone_inputs(inputs)
        buffers = self.output_buffers(ref, runner)
        reply = runner.request(self.req.call_timeout_s, op="call", inputs=shared, buffers=buffers, guard=guard)
        self.add_flags(reply.get("flags"))
        outs = buffers if runner.cuda else runner.receive_outputs(self.req.call_timeout_s)
        mutated = any(isinstance(a, torch.Tensor) and not torch.equal(a, b) for a, b in zip(shared, inputs))
        return outs, mutated

    def check(self, runner: RunnerProcess) -> None:
        other_ref = None
        for i in range(self.req.n_checks):
            inputs = make_inputs(self.ref, self.new_seed(), self.req.device)
            ref = run_reference(self.model, inputs)
            # Alternate guarded and unguarded calls: a candidate that behaves only when watched still
            # has its unguarded outputs checked.
            outs, mutated = self.call_candidate(runner, inputs, ref, guard=(i % 2 == 0))
            if mutated:
                self.add_flags({"input_mutation": [f"check {i}"]})
            reason = checks.compare(outs, ref, self.tol)
            if reason:
                raise CandidateFailed("incorrect", f"check {i}: {reason}")
            accepted = checks.accepted_probes(ref, inputs, other_ref, self.tol)
            wide = self.widened_call(runner, inputs) if accepted or i < FP64_CHECKS else None
            if accepted:
                self.info.setdefault("degenerate_probes", sorted(set(accepted)))
                self.check_degenerate(outs, ref, wide, accepted, i)
            if i < FP64_CHECKS:
                # Zero-mean inputs where the candidate handles them: sums of same-sign terms are so
                # well conditioned that fp16 inputs stay within 1e-5 of the float64 result.
                usable = wide is not None and checks.compare(wide[2], wide[1], self.tol) is None
                self.check_precision(*(wide if usable else (inputs, ref, outs)))
            other_ref = ref
            del inputs, outs, wide

    def region_checks(self, runner: RunnerProcess) -> None:
        """After `check` (whose input sets and outputs are freed by then: on multi-GB problems the
        memory matters): a gentle and a strong region check."""
        for j, strength in enumerate(REGION_STRENGTHS):
            self.region_check(runner, j, strength)
            release_cached_memory(self.req.device)

    def region_check(self, runner: RunnerProcess, j: int, strength: str = "gentle") -> None:
        """An input set in which one secret region is amplified until the reference's output moves:
        a candidate that reads only part of its input (a loss estimated from sampled rows, every k-th
        element, an early exit) misses it or overweights it. i.i.d. inputs let such an estimate pass at
        1e-2; here it must also follow the change: each output's change between the plain and the
        amplified set must match the reference's (`checks.change_mismatch`)."""
        base = make_inputs(self.ref, self.new_seed(), self.req.device)
        found = find_region(self.model, base, self.rng, self.model64, strongest=strength == "strong", tol=self.tol)
        if found is None:  # no region of any input moves the output at the tolerance: nothing to test
            self.info.setdefault("region_checks", []).append("skipped: no region moves the output")
            return
        where, amplify, ref_base, ref_amp = found
        self.info.setdefault("region_checks", []).append(where)
        outs, _ = self.call_candidate(runner, base, ref_base, guard=False)
        reason = checks.compare(outs, ref_base, self.tol)
        if reason:
            raise CandidateFailed("incorrect", f"region check {j}: {reason}")
        err_base = [o.sub_(r) if o.is_floating_point() else None for o, r in zip(outs, ref_base)]  # in place: memory
        del outs
        with amplify():
            outs_amp, _ = self.call_candidate(runner, base, ref_amp, guard=False)
        reason = checks.compare(outs_amp, ref_amp, self.tol)
        if reason:
            raise CandidateFailed("incorrect", f"region check {j} ({where}): {reason}")
        del base
        reason = checks.change_mismatch(outs_amp, ref_amp, ref_base, err_base, self.tol, REGION_CHANGE_TOL)
        if reason:
            raise CandidateFailed("incorrect", f"region check {j} ({where}): the output does not follow the change "
                                               f"({reason}); does it read all of its input?")

    def widened_call(self, runner: RunnerProcess, inputs: list):
        """(inputs, reference, candidate outputs) on the widened domain; None where the reference
        itself is undefined there (log, sqrt, ...)."""
        wide = widened(inputs, self.new_seed())
        wide_ref = run_reference(self.model, wide)
        if not all(bool(torch.isfinite(r).all()) for r in wide_ref if r.is_floating_point()):
            return None
        wide_outs, _ = self.call_candidate(runner, wide, wide_ref, guard=False)
        return wide, wide_ref, wide_outs

    def check_degenerate(self, outs, ref, wide, accepted: list[str], i: int) -> None:
        """The problem's tolerance check accepts a trivial answer: demand more than it does."""
        err = checks.rel_l2(outs, ref)
        if err > self.tol.rtol:
            self.add_flags({"degenerate_output": [f"check {i}: rel. L2 error {err:.2g} (problem accepts {', '.join(accepted)})"]})
            return
        if wide is None:
            return
        _, wide_ref, wide_outs = wide
        reason = checks.compare(wide_outs, wide_ref, self.tol)
        wide_err = checks.rel_l2(wide_outs, wide_ref)
        if reason or wide_err > self.tol.rtol:
            self.add_flags({"degenerate_output": [f"wrong on widened inputs ({reason or f'rel. L2 error {wide_err:.2g}'}); "
                                                  f"problem accepts {', '.join(accepted)}"]})

    def check_precision(self, inputs: list, ref: list[torch.Tensor], outs: list[torch.Tensor]) -> None:
        ref64 = reference_fp64(self.model64(), inputs)
        if ref64 is None:
            return
        err, err_ref = checks.precision_error(outs, ref, ref64)
        self.info["max_rel_err_fp64"] = max(err, self.info.get("max_rel_err_fp64", 0.0))
        if checks.is_downcast(err, err_ref):
            self.add_flags({"precision_downcast": [f"rel. error vs fp64 {err:.2g} (fp32 reference {err_ref:.2g})"]})

    def timing_sets(self) -> tuple[list[list], list[list[torch.Tensor]]]:
        first = make_inputs(self.ref, self.new_seed(), self.req.device)
        # At least two sets, so the same buffer never holds the same inputs twice in a row.
        n_sets = max(2, min(4, TIMING_INPUT_BUDGET_BYTES // max(1, nbytes(first))))
        sets = [first] + [make_inputs(self.ref, self.new_seed(), self.req.device) for _ in range(n_sets - 1)]
        return sets, [run_reference(self.model, s) for s in sets]

    def time_candidate(self, runner: RunnerProcess, sets, refs) -> dict:
        """Candidate (runner) and eager reference (here), rep by rep, same input rotation."""
        timer = Timer(self.req.device, method=timer_method(self.req.timing_mode))
        runner.request(self.req.call_timeout_s, op="set_timing_inputs", sets=sets)
        buffers = self.output_buffers(refs[0], runner)
        if self.req.timing_mode == "paper":
            return self.time_candidate_paper(runner, sets, refs, buffers)
        # Every rep hands its output over in the same round trip, into buffers poisoned with NaN
        # (CUDA) or by value (CPU), and every one is checked: a candidate that is correct only while
        # checked has no unchecked call to cheat in.
        clock = RepClock(runner)
        empty: list[tuple] = []
        reps: list[tuple] = []  # (wall ms, CPU ms of the candidate's process, CPU ms of its main thread) per rep
        parts: list[dict] = []  # the candidate's reps' parts (CUDA: Timer._time_queued)
        empty_parts: list[dict] = []
        self.empty_rep(runner, buffers, refs, 0, len(sets), clock, [])  # a first, cold one: not a yardstick
        for i in range(3):
            empty.append(self.empty_rep(runner, buffers, refs, i, len(sets), clock, empty_parts))
        eager_times, eager_parts = [], []

        def rep(i: int) -> float:
            if i % 5 == 4:  # empty reps throughout, so a change of load meets both kinds alike
                empty.append(self.empty_rep(runner, buffers, refs, i, len(sets), clock, empty_parts))
            ms, rep_parts, measured = self.timed_rep(runner, buffers, refs, i, len(sets), clock)
            reps.append(measured)
            parts.append(rep_parts)
            if self.req.eager_baseline:
                with torch.no_grad():
                    timer.flush()
                    eager_times.append(timer.time_ms(lambda: self.model(*sets[rep_layout(i, len(sets))[1]]))[0])
                    eager_parts.append(timer.last_parts)
                    write_trace(timer.last_trace, role="eager", **self.trace_about)
            return ms

        times = adaptive_reps(rep, self.req.min_reps, self.req.max_reps, self.req.max_timing_s)
        evidence = clock.evidence(times, parts, reps, empty, empty_parts)
        if timer.trace:  # a benchmark's trace: each rep ran its call three times, the wall and CPU bounds mean nothing
            evidence = None
        self.info["time_floors_ms"] = dict(clock.floors, cpus=clock.n_cpus)  # the judge's own bounds on a rep
        if evidence:
            # One sign is not proof: a rep that waited on a busy machine looks like one. Measure again,
            # empty and timed reps in turn, and flag only what is still there.
            again, again_parts, again_reps, again_empty, again_empty_parts = [], [], [], [], []
            for j in range(CONFIRM_REPS):
                again_empty.append(self.empty_rep(runner, buffers, refs, j, len(sets), clock, again_empty_parts))
                ms, rep_parts, measured = self.timed_rep(runner, buffers, refs, j, len(sets), clock)
                again.append(ms)
                again_parts.append(rep_parts)
                again_reps.append(measured)
            confirmed = clock.evidence(again, again_parts, again_reps, again_empty, again_empty_parts)
            self.info["timer_check"] = {"first": evidence, "again": confirmed}
            if confirmed:
                self.add_flags({"timer_tamper": [confirmed]})
        stats = summarize(times)
        stats["timed_outputs_checked"] = len(times)
        stats.update(method_summary(timer, parts))
        result = {"t_candidate_ms": stats["median_ms"], "timing": stats}
        if eager_times:
            result["t_eager_ms"] = summarize(eager_times)["median_ms"]
            result["timing"]["eager_iqr_ms"] = summarize(eager_times)["iqr_ms"]
            result["timing"].update({f"eager_{k}": v for k, v in method_summary(timer, eager_parts).items() if k != "method"})
        return result

    def timing_round(self, runner: RunnerProcess, sets, refs, compiled) -> dict:
        """The candidate and eager interleaved, the runner's integrity, then compile (if live) on the same inputs."""
        out = self.time_candidate(runner, sets, refs)
        self.add_flags(runner.request(self.req.call_timeout_s, op="integrity").get("flags"))
        if compiled is not None:
            baseline = time_reference(self.model, compiled, sets, self.req.device, self.req.timing_mode, self.req)
            out.update(t_compile_ms=baseline.get("t_compile_ms"), compile=baseline.get("compile"))
        return out

    def empty_rep(self, runner: RunnerProcess, buffers, refs, i: int, n_sets: int, clock: "RepClock", parts: list):
        """A rep without the call (same input load, flush, spin and hand-over): the yardstick of timed
        reps; its parts (CUDA) go to `parts`."""
        slot, content = rep_layout(i, n_sets)
        with clock.measure() as measured:
            reply = runner.request(self.req.call_timeout_s, op="empty_rep", slot=slot, content=content, buffers=buffers,
                           like=[(list(r.shape), str(r.dtype).replace("torch.", "")) for r in refs[0]])
            write_trace(reply.get("trace"), role="empty", **self.trace_about)
            if not runner.cuda:
                runner.receive_outputs(self.req.call_timeout_s)
        if runner.cuda:
            parts.append(reply_parts(reply, reply_ms(reply)))
        return measured.value

    def timed_rep(self, runner: RunnerProcess, buffers, refs, i: int, n_sets: int, clock: "RepClock"):
        """One timed call: (the time the candidate's process reported, its parts, (wall ms, CPU ms)); its
        output is checked."""
        slot, content = rep_layout(i, n_sets)
        self.poison(buffers)
        with clock.measure() as measured:
            reply = runner.request(self.req.call_timeout_s, op="rep", slot=slot, content=content, buffers=buffers)
            outs = buffers if runner.cuda else runner.receive_outputs(self.req.call_timeout_s)
        ms = reply_ms(reply)
        rep_parts = reply_parts(reply, ms) if runner.cuda else {}
        write_trace(reply.get("trace"), role="candidate", **self.trace_about)
        self.check_timed_output(outs, refs[content], i)
        return ms, rep_parts, measured.value

    @functools.cached_property
    def trace_about(self) -> dict:  # once per judge: the reps call write_trace whether or not a trace is on
        return trace_about(self.req)

    def time_candidate_paper(self, runner: RunnerProcess, sets, refs, buffers) -> dict:
        """CUDA Agent's method (profiler kernel time, 5 warm-up + 10 calls, no flush) for candidate and
        eager, and the harness's guarantees kept: the outputs of the timed calls are checked."""
        reply = runner.request(self.req.call_timeout_s, op="paper")
        self.add_flags(reply.get("flags"))
        ms = reply_ms(reply)
        kept = reply.get("kept")
        if isinstance(kept, bool) or not isinstance(kept, int) or not 1 <= kept <= PAPER_REPS:
            raise CandidateFailed("rejected", "malformed reply from the candidate's process during 'paper'",
                                  {"protocol_tamper": ["kept"]})
        for i in range(kept):
            self.poison(buffers)
            runner.request(self.req.call_timeout_s, op="paper_output", index=i, buffers=buffers)
            outs = buffers if runner.cuda else runner.receive_outputs(self.req.call_timeout_s)
            self.check_timed_output(outs, refs[0], i)
        with torch.no_grad():
            eager = profiler_kernel_ms(lambda: self.model(*sets[0]), reps=PAPER_REPS) if runner.cuda else None
        return {"t_candidate_ms": ms, "t_eager_ms": eager,
                "timing": {"reps": PAPER_REPS, "timed_outputs_checked": kept}}

    @staticmethod
    def output_buffers(ref: list[torch.Tensor], runner: RunnerProcess) -> list[torch.Tensor] | None:
        """Where the candidate's process writes its outputs (CUDA); None on CPU (sent by value)."""
        if not runner.cuda:
            return None
        return [torch.full_like(r, float("nan")) if r.is_floating_point() else torch.empty_like(r) for r in ref]

    @staticmethod
    def poison(buffers: list[torch.Tensor] | None) -> None:
        for b in buffers or []:
            b.fill_(float("nan") if b.is_floating_point() else -1)

    def check_timed_output(self, outs: list[torch.Tensor], ref: list[torch.Tensor], i: int) -> None:
        reason = checks.compare(outs, ref, self.tol)
        if reason:
            raise CandidateFailed("rejected", f"timed call {i} returned a wrong result ({reason}): correct only while checked",
                                  {"timed_output_mismatch": [f"rep {i}"]})


def synced_since(t0: float, device: str) -> float:
    """Seconds since t0 (time.perf_counter), once the device's queued work is done."""
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)
    return time.perf_counter() - t0


def compile_reference(model, sets: list[list], device: str) -> tuple[object, float]:
    """torch.compile (inductor, default mode) and its first call: CPU-heavy, so done outside the
    exclusive GPU lock. Returns (compiled model, seconds)."""
    from cudagym.eval.compile_cache import reroot_static_autotuners

    reroot_static_autotuners()  # kernels from a carried cache tune into this machine's cache
    t0 = time.perf_counter()
    compiled = torch.compile(model)
    with torch.no_grad():
        compiled(*sets[0])
    return compiled, synced_since(t0, device)


@contextlib.contextmanager
def autotuning_locked(req: Request):
    """torch.compile of a reference outside the GPU lock, its Triton autotuning inside it (shared).
    A baseline run compiles on a dozen judges while others time: a compile held the shared lock for
    its whole first call (seconds to a minute of CPU codegen for an L3 net), and each timing turn waited
    for every compile under way, the compiles queued behind it meanwhile; on the H200 a cold run
    timed 47 of 250 in 8 minutes that way. What a compile runs on the GPU is the autotuner's
    benchmarks, which must not overlap a timing, and one forward pass of the reference.
    Only outside any gpu_lock of this process: a shared lock taken twice can deadlock with a timer
    waiting at the turnstile."""
    if not req.device.startswith("cuda") or not req.lock_path:
        yield
        return
    from torch._inductor.runtime.triton_heuristics import CachingAutotuner

    benchmark = CachingAutotuner.benchmark_all_configs

    def locked(self, *args, **kwargs):
        with gpu_lock(req.lock_path, exclusive=False):
            return benchmark(self, *args, **kwargs)

    CachingAutotuner.benchmark_all_configs = locked
    try:
        yield
    finally:
        CachingAutotuner.benchmark_all_configs = benchmark


def rep_layout(i: int, n_sets: int) -> tuple[int, int]:
    """(slot, input set) of timed rep i: two buffers, and each one's contents change between its uses."""
    slot = i % 2
    return slot, (i // 2 + slot) % n_sets


class RepClock:
    """The judge's own clocks around a rep: its wall clock, the CPU time the candidate's process used
    (the kernel's per-process clock) and the CPU time of its main thread, which makes the calls
    (the kernel's schedstat): none of them the candidate can change."""

    def __init__(self, runner: RunnerProcess):
        self.cpu = process_cpu_clock(runner.proc.pid)
        self.thread = thread_cpu_clock(runner.proc.pid)
        try:
            self.n_cpus = len(os.sched_getaffinity(runner.proc.pid))
        except OSError:
            self.n_cpus = os.cpu_count() or 1

    @contextlib.contextmanager
    def measure(self):
        measured = types.SimpleNamespace(value=None)
        c0 = self.cpu() if self.cpu else None
        h0 = self.read_thread()
        t0 = time.perf_counter()
        yield measured
        wall = (time.perf_counter() - t0) * 1e3
        h1 = self.read_thread()
        measured.value = (wall, (self.cpu() - c0) * 1e3 if self.cpu else None,
                          (h1 - h0) * 1e3 if h0 is not None and h1 is not None else None)

    def read_thread(self) -> float | None:
        if self.thread is None:
            return None
        try:
            return self.thread()
        except (OSError, ValueError, IndexError):  # the process ended: the rep fails on its own
            return None

    def evidence(self, reported: list[float], parts: list[dict], reps: list, empty: list, empty_parts: list[dict]) -> str | None:
        """Why the reps' times cannot be true, or None. Against the judge's clocks stands each rep's whole
        window (synchronised at both ends, so it holds the host's path through the call, which those
        clocks bound; the reported time where a rep has no parts); then the tail of the call's stream."""
        args = self.series(reps, empty)
        floors = time_floors(*args[:4], self.n_cpus, *args[4:])
        self.floors = {name: round(ms, 4) for name, ms in zip(("wall", "cpu", "thread"), floors)}
        if args[4] and args[5]:
            self.floors["thread_noise"] = round(median_noise_ms(args[4], args[5]), 4)
        return (tamper_evidence(windows(reported, parts), *args[:4], self.n_cpus, *args[4:])
                or tail_evidence(parts, empty_parts))

    @staticmethod
    def series(reps: list, empty: list) -> tuple:
        """(rep walls, empty walls, rep CPU times, empty CPU times, rep main-thread CPU times, empty
        main-thread CPU times); a CPU series None where any of its reps went unread."""
        def column(rows: list, k: int) -> list[float] | None:
            values = [row[k] for row in rows]
            return values if values and all(v is not None for v in values) else None

        return ([r[0] for r in reps], [r[0] for r in empty], column(reps, 1), column(empty, 1),
                column(reps, 2), column(empty, 2))


PART_KEYS = ("window_ms", "spin_ms", "call_ms", "tail_ms", "host_ms")


def reply_parts(reply: dict, ms: float) -> dict:
    """A CUDA rep's parts from the candidate's process (Timer._time_queued), or {} (the window method):
    numbers; the reported time is the call's part; the whole window, timed by its own pair of
    events, is the sum of the spin, the call and the tail."""
    parts = reply.get("parts")
    if parts is None:
        return {}
    if not isinstance(parts, dict) or not all(isinstance(parts.get(k), (int, float)) and not isinstance(parts.get(k), bool)
                                              and 0 <= parts[k] < 1e7 for k in PART_KEYS) \
            or parts.get("exposed") not in (0, 1):
        raise CandidateFailed("rejected", "malformed reply from the candidate's process during a rep",
                              {"protocol_tamper": ["parts"]})
    whole = parts["spin_ms"] + parts["call_ms"] + parts["tail_ms"]
    if ms != parts["call_ms"] or abs(whole - parts["window_ms"]) > PARTS_SLACK_MS + PARTS_SLACK * parts["window_ms"]:
        raise CandidateFailed("rejected", f"timer reported {ms:.4f} ms, parts {json.dumps(parts)[:200]} that do not add up",
                              {"timer_tamper": ["rep parts do not add up"]})
    return {k: float(parts[k]) for k in PART_KEYS} | {"exposed": parts["exposed"]}


def windows(times: list[float], parts: list[dict]) -> list[float]:
    """The whole windows of reps (their reported times where a rep has no parts: CPU, the window method)."""
    return [p.get("window_ms", ms) for ms, p in zip(times, parts)]


def tail_evidence(parts: list[dict], empty_parts: list[dict]) -> str | None:
    """Work that outlasted the call's stream: a queued rep's tail (its end event to the device-wide
    synchronisation's) is, for a call on its stream alone, the synchronisation's wake-up, as in an
    empty rep. Kernels left running on another stream, or time moved out of the call, make it longer."""
    tails = [p["tail_ms"] for p in parts if "tail_ms" in p]
    empty = [p["tail_ms"] for p in empty_parts if "tail_ms" in p]
    if len(tails) < 3 or len(empty) < 3:
        return None
    mine, usual = statistics.median(tails), statistics.median(empty)
    if mine > usual + max(TAIL_MARGIN_MS, TAIL_FACTOR * usual):
        return f"work outlasted the call's stream: {mine:.4f} ms from its end to the device's, {usual:.4f} ms in empty reps"
    return None


def method_summary(timer: Timer, parts: list[dict]) -> dict:
    """How the reps were timed, and the medians of their parts, for people comparing methods (verdict.timing)."""
    if not timer.cuda:
        return {"method": "wall"}
    out = {"method": "queued" if timer.queued else "window"}
    for key in PART_KEYS:
        values = [p[key] for p in parts if key in p]
        if values:
            out[f"{key[:-3]}_median_ms"] = statistics.median(values)
    if parts and all("exposed" in p for p in parts):
        out["exposed_fraction"] = sum(p["exposed"] for p in parts) / len(parts)
    return out


def reply_ms(reply: dict) -> float:
    """A time from the candidate's process, which must at least look like one."""
    ms = reply.get("ms")
    if isinstance(ms, bool) or not isinstance(ms, (int, float)) or not 0 <= ms < 1e7:
        raise CandidateFailed("rejected", "timer returned a non-time", {"timer_tamper": [repr(ms)[:50]]})
    return float(ms)


def at_milestone_edge(timed: dict, band: float, known_compile_ms: float | None = None) -> bool:
    """Whether a round's candidate time is within `band` of a milestone over eager or compile."""
    t = timed.get("t_candidate_ms")
    return any(near_milestone(t, base, band) for base in (timed.get("t_eager_ms"),
                                                               timed.get("t_compile_ms") or known_compile_ms))


def median_round(rounds: list[dict]) -> dict:
    """One round as it is; several: the first (compile's statistics, when it timed compile) with the
    statistics of the round whose candidate time is the median, each of the three times the median of its
    rounds', every round's times kept, and the timed outputs checked counted over all of them."""
    if len(rounds) == 1:
        return rounds[0]
    keys = ("t_candidate_ms", "t_eager_ms", "t_compile_ms")
    ordered = sorted(rounds, key=lambda r: r["t_candidate_ms"])
    out = copy.deepcopy(rounds[0])
    out["timing"] = copy.deepcopy(ordered[(len(ordered) - 1) // 2]["timing"])
    for key in keys:
        values = [r[key] for r in rounds if r.get(key) is not None]
        if values:
            out[key] = statistics.median(values)
    out["timing"]["rounds"] = [{k: r.get(k) for k in keys} for r in rounds]
    out["timing"]["timed_outputs_checked"] = sum(r["timing"].get("timed_outputs_checked", 0) for r in rounds)
    return out


def time_reference(model, compiled, sets: list[list], device: str, timing_mode: str, req: Request) -> dict:
    """Eager and (if given) compiled baselines, interleaved rep by rep on the same input rotation."""
    timer = Timer(device, method=timer_method(timing_mode))
    if timing_mode == "paper":
        with torch.no_grad():
            out = {"t_eager_ms": profiler_kernel_ms(lambda: model(*sets[0]))}
            if compiled is not None:
                out["t_compile_ms"] = profiler_kernel_ms(lambda: compiled(*sets[0]))
        return out
    eager, comp, eager_parts, comp_parts = [], [], [], []
    about = trace_about(req)
    with torch.no_grad():  # one untimed call each: a fresh process's lazy module loads and library handles
        model(*sets[0])
        if compiled is not None:
            compiled(*sets[0])
    timer.sync()

    def rep(i: int) -> float:
        with torch.no_grad():
            timer.flush()
            ms = timer.time_ms(lambda: model(*sets[i % len(sets)]))[0]
            eager_parts.append(timer.last_parts)
            write_trace(timer.last_trace, role="reference_eager", **about)  # not the live eager beside the candidate
            eager.append(ms)
            if compiled is not None:
                timer.flush()
                comp.append(timer.time_ms(lambda: compiled(*sets[i % len(sets)]))[0])
                comp_parts.append(timer.last_parts)
                write_trace(timer.last_trace, role="compile", **about)
        return ms + (comp[-1] if comp else 0.0)

    adaptive_reps(rep, req.min_reps, req.max_reps, req.max_timing_s)
    eager_stats = {**summarize(eager), **method_summary(timer, eager_parts)}
    out = {"t_eager_ms": eager_stats["median_ms"], "eager": eager_stats}
    if compiled is not None:
        comp_stats = {**summarize(comp), **method_summary(timer, comp_parts)}
        out.update(t_compile_ms=comp_stats["median_ms"], compile=comp_stats)
    return out


def mark_phase(req: Request, phase: str) -> None:
    """Note what the judge does now, for the one who waits on it: a judge killed at a deadline or by
    Ctrl-C is reported with where it was (waiting for memory, for the timing lock, ...)."""
    path = os.path.join(req.workdir, PHASE_FILE)
    try:
        with open(path + ".tmp", "w") as f:
            json.dump({"phase": phase, "since": time.time()}, f)
        os.replace(path + ".tmp", path)
    except OSError:
        pass


def trace_about(req: Request) -> dict:
    """Which judge a traced rep came from: the problem (its code's hash, the same in every run), mode, pid."""
    return {"problem": sha256_text(req.ref_code)[:12], "mode": req.mode, "pid": os.getpid()}


@contextlib.contextmanager
def timing_turn(req: Request, *pids: int):
    """The GPU alone (the exclusive lock) and its timing cores, for this process and pids."""
    with gpu_lock(req.lock_path, exclusive=True), on_cpus([os.getpid(), *pids], req.timing_cpus):
        yield


def environment(device: str) -> dict:
    env = {"torch": torch.__version__.split("+")[0], "device": device}
    if device.startswith("cuda"):
        env.update(gpu=torch.cuda.get_device_name(device), cuda=torch.version.cuda)
    else:
        env.update(gpu="cpu", cuda=None)
    return env


# How long a timing judge waits for another judge's compile of its problem before compiling it itself.
COMPILE_CLAIM_WAIT_S = 300.0
COMPILED_MARKS = "cudagym-compiled"  # in the inductor cache: one empty file per problem compiled into it


def compile_claim_key(device: str, precision: str, ref_code: str) -> str:
    """The claim's name: one problem's compile on one device in one precision."""
    return hashlib.sha256(f"{device}\0{precision}\0{ref_code}".encode()).hexdigest()[:32]


def compiled_mark(req: Request) -> str | None:
    """The file that says this problem is compiled into this machine's inductor cache: there, not in the
    lock folder, since a fresh cache (a new CUDAGYM_CACHE, an imported bundle) has compiled nothing yet."""
    cache = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if not cache:
        return None
    # torch's own keys change with its version and the GPU: a mark from before an upgrade is no compile
    machine = f"{torch.__version__} {environment(req.device).get('gpu')} {req.device}"
    return os.path.join(cache, COMPILED_MARKS, compile_claim_key(machine, req.precision, req.ref_code))


@contextlib.contextmanager
def reference_compile_claim(req: Request):
    """The work queue of a baseline run's compile judges, and what keeps two judges off one compile.
    Every compile (`warm`) judge walks the same list of problems in the same order and takes the next
    one no judge has compiled (`compiled_mark`) or claims now (`gpulock.compile_claim`, in the machine's
    lock folder): a dozen long-lived judges share the work as a queue would, paying the process start
    and inductor's first compile (~10 s each) once, not once per chunk. A timing judge that reaches a
    problem under way waits for that compile and then finds it in the shared caches; before, it
    compiled the same graph beside it (on the H200 a timing judge spent 181 s on a DenseNet its compile
    judge had begun, the cold run's last 90 s). Yields whether this judge goes on with the problem:
    a timing judge always does (at worst after the wait), a compile judge only with the claim."""
    folder = req.lock_dir or (os.path.dirname(req.lock_path) if req.lock_path else None)
    if not folder or not (req.mode == "warm" or req.compile_baseline):
        yield True
        return
    warm, mark = req.mode == "warm", compiled_mark(req)
    if mark and os.path.exists(mark):  # compiled: a timing judge finds it in the caches
        yield not warm
        return
    key = compile_claim_key(req.device, req.precision, req.ref_code)
    with compile_claim(folder, key, wait_s=0.0) as held:
        if held or warm:  # held: unless compiled between the look and the claim
            yield held and not (warm and mark and os.path.exists(mark))
            return
    mark_phase(req, "waiting for another judge's compile of this problem")
    with compile_claim(folder, key, wait_s=COMPILE_CLAIM_WAIT_S):  # then a cache hit; past the wait, a compile
        yield True


def mark_compiled(req: Request) -> None:
    mark = compiled_mark(req)
    if mark:
        with contextlib.suppress(OSError):  # a mark that cannot be written costs a cache-hit compile, no more
            os.makedirs(os.path.dirname(mark), exist_ok=True)
            open(mark, "a").close()


def _reference_phases(req: Request, ev: Evaluation, result: dict, phase_s: dict, t0: float) -> None:
    """A baseline or warm judge's work on its problem, once admitted: build it and its inputs, compile
    it (warm, or a baseline with compile_baseline), time it (baseline); the seconds of each in phase_s."""
    with ev.reservation():
        phase_s["memory"], t0 = time.perf_counter() - t0, time.perf_counter()
        with gpu_lock(req.lock_path, exclusive=req.exclusive):
            ev.build_model(on_device=True)
            sets = [make_inputs(ev.ref, ev.new_seed(), req.device)] if req.mode == "warm" else ev.timing_sets()[0]
        phase_s["inputs"], t0 = time.perf_counter() - t0, time.perf_counter()
        compiled = None
        if req.mode == "warm" or req.compile_baseline:
            with autotuning_locked(req):
                compiled, result["compile_s"] = compile_reference(ev.model, sets, req.device)
            mark_compiled(req)
            phase_s["compile"], t0 = time.perf_counter() - t0, time.perf_counter()
        if req.mode == "baseline":
            with timing_turn(req):
                phase_s["turn"], t0 = time.perf_counter() - t0, time.perf_counter()
                result.update(time_reference(ev.model, compiled, sets, req.device, req.timing_mode, req))
            phase_s["timing"] = time.perf_counter() - t0


def evaluate(req: Request) -> dict:
    """Verdict fields for a candidate (mode eval), baseline times (mode baseline) or accepted probes (audit)."""
    set_fp32_precision(req.precision)  # the device is set (its CUDA context made) once admitted: Evaluation.reservation
    if req.lock_path is None and req.lock_dir:  # the machine's lock of this device, whoever started the judge
        req.lock_path = device_lock_path(req.lock_dir, req.device)
    result: dict = {"env": environment(req.device), "timing_mode": req.timing_mode, "precision": req.precision}
    if req.mode in ("warm", "baseline"):  # warm: compile only, to fill the shared caches; nothing is timed
        # phase_s: where a reference's time goes (waiting for another judge's compile of it, for memory,
        # building it and its inputs, the lock wait included, compiling, waiting for the timing turn,
        # timing), for the baseline run's progress
        phase_s, t0 = {}, time.perf_counter()
        try:
            with reference_compile_claim(req) as go_on:
                if not go_on:  # a compile judge: another judge compiled this problem, or compiles it now
                    return dict(result, compiled_elsewhere=True)
                if time.perf_counter() - t0 > 0.5:
                    phase_s["other compile"], t0 = time.perf_counter() - t0, time.perf_counter()
                _reference_phases(req, Evaluation(req), result, phase_s, t0)
        except AdmissionDeferred as waited:  # the driver runs it again after this judge's other tasks
            return dict(result, deferred=True, reason=str(waited))
        result["phase_s"] = {k: round(v, 3) for k, v in phase_s.items()}
        return result
    if req.mode == "audit":
        ev = Evaluation(req)
        with ev.reservation(), gpu_lock(req.lock_path, exclusive=req.exclusive):
            return {**result, **audit(ev)}
    if req.mode in ("filter", "filter-check", "filter-time", "filter-probe"):
        ev = Evaluation(req)
        t0 = time.perf_counter()
        with ev.reservation():
            waited = time.perf_counter() - t0
            if req.device.startswith("cuda"):
                torch.cuda.reset_peak_memory_stats(req.device)
            if req.mode == "filter-probe":
                measured = probe_task(ev)
            else:
                measured = measure_task(ev, timed=req.mode != "filter-check", checked=req.mode == "filter-time")
            memory = task_memory(ev)
        # admit_s: the memory budget's part of the wait (the rest is the GPU lock's), told apart because the
        # two have different cures: on the H100 (session 28) check passes, which take no exclusive turn at
        # all, still waited 317-1,112 judge-seconds
        return {**result, **measured, **memory, "wait_s": waited + measured.get("wait_s", 0.0), "admit_s": waited}
    stack = contextlib.ExitStack()
    runner = RunnerProcess(req)  # starts importing torch (no CUDA context yet) while the reference loads
    ev = Evaluation(req)
    phase_s, t0 = {}, time.perf_counter()
    try:
        # Admission first: the runner's load makes its CUDA context and warms it up (cuBLAS, cuDNN, the
        # profiler), memory the ledger must know of; so the build runs under the reservation, outside
        # the GPU lock (CPU work). Judges waiting here hold no GPU memory at all.
        mark_phase(req, "waiting for GPU memory")
        stack.enter_context(ev.reservation())
        phase_s["wait_memory"], t0 = time.perf_counter() - t0, time.perf_counter()
        mark_phase(req, "loading the candidate (its build, or waiting for another build of the same candidate)")
        reply = runner.load(req.init_timeout_s, code=req.candidate_code, files=req.candidate_files, device=req.device,
                            policy=req.policy, task_dtypes=sorted(task_dtypes(ev.ref, ev.init_args)),
                            timing_mode=req.timing_mode, precision=req.precision)
        result["env"]["sandbox"] = reply.get("sandbox")
        ev.add_flags(reply.get("flags"))
        phase_s["load"], t0 = time.perf_counter() - t0, time.perf_counter()
        mark_phase(req, "waiting for the GPU lock")
        with gpu_lock(req.lock_path, exclusive=req.exclusive):
            mark_phase(req, "checking")
            ev.build_model()
            reply = runner.request(req.call_timeout_s, op="init", init_args=ev.init_args, state_dict=ev.model.state_dict(),
                                   init_seed=ev.init_seed, gpu_memory_fraction=req.gpu_memory_fraction)
            ev.add_flags(reply.get("flags"))
            ev.check(runner)
            if not ev.flags:
                ev.region_checks(runner)
            phase_s["check"], t0 = time.perf_counter() - t0, time.perf_counter()
            if ev.flags:
                raise CandidateFailed("rejected", "hack checks fired: " + ", ".join(sorted(ev.flags)))
            sets, refs = ev.timing_sets() if req.time_candidate else (None, None)
            compiled = None
            if req.time_candidate and req.compile_baseline:
                compiled, result["compile_s"] = compile_reference(ev.model, sets, req.device)
        if req.time_candidate:
            t0 = time.perf_counter()
            mark_phase(req, "waiting for its turn to time (the GPU alone)")
            with timing_turn(req, runner.proc.pid):
                mark_phase(req, "timing")
                rounds = [ev.timing_round(runner, sets, refs, compiled)]
                if not ev.flags and at_milestone_edge(rounds[0], req.edge_band, req.known_compile_ms):
                    for i in range(EDGE_ROUNDS - 1):  # compile's time is the first round's: a baseline, not the candidate
                        mark_phase(req, f"timing again: a speedup at a milestone's edge (round {i + 2} of {EDGE_ROUNDS})")
                        # Fresh inputs (new seeds). Small sets stay allocated while the new ones are made, so
                        # the new ones lie elsewhere in memory; large ones are freed first (the memory share).
                        if sum(nbytes(s) + nbytes(r) for s, r in zip(sets, refs)) > EDGE_KEEP_BYTES:
                            sets = refs = None
                            gc.collect()
                        sets, refs = ev.timing_sets()
                        rounds.append(ev.timing_round(runner, sets, refs, None))
                result.update(median_round(rounds))
            phase_s["time"] = time.perf_counter() - t0
            if ev.flags:
                raise CandidateFailed("rejected", "hack checks fired: " + ", ".join(sorted(ev.flags)))
        result.update(status="pass")
    except CandidateFailed as failure:
        ev.add_flags(failure.flags)
        result.update(status=failure.status, reason=failure.reason)
        if failure.trace:
            result["trace"] = failure.trace  # the candidate's traceback, for the person debugging it
        result.pop("t_candidate_ms", None)
    finally:
        runner.close()
        stack.close()
    result["flags"] = sorted(ev.flags)
    result["flag_details"] = ev.flags
    result["info"] = dict(ev.info, phase_s={k: round(v, 2) for k, v in phase_s.items()})
    return result


def audit(ev: Evaluation) -> dict:
    """What this problem's check can tell apart, on every one of n_checks (>= 2) input sets:
    - accepts: the degenerate probes the check accepts (`affine` only where the fit made on the
      problem's own inputs fails on widened ones: a problem that is affine in its input is not
      degenerate for it);
    - near: the probes within rtol of the reference in relative L2 (an output that barely depends on
      its input, or is nearly constant, makes a weak check even where no probe passes elementwise);
    - input_sensitivity: the median relative L2 change of the output between input sets;
    - stochastic_ops: the random ops the reference runs (it then has no one right answer);
    - cost: FLOPs (torch's flop counter) and the bytes every input, weight and output occupy, for
      speed-of-light figures."""
    req = ev.req
    ev.build_model()
    n_sets = max(2, req.n_checks)
    accepted_all, near_all, other_ref, stochastic, changes = set(checks.PROBES), set(checks.PROBES), None, [], []
    cost = None
    for i in range(n_sets):
        inputs = make_inputs(ev.ref, ev.new_seed(), req.device)
        if i == 0:
            ref, ops = reference_with_ops(ev.model, inputs)
            stochastic = sorted(set(ops) & STOCHASTIC_OPS)
            cost = problem_cost(ev.model, inputs, ref)
        else:
            ref = run_reference(ev.model, inputs)
            changes.append(checks.rel_l2(ref, other_ref))
        accepted = set(checks.accepted_probes(ref, inputs, other_ref, ev.tol))
        near = {name for name, fn in checks.PROBES.items()
                if (out := fn(ref, inputs, other_ref)) is not None and checks.structure_mismatch(out, ref) is None
                and checks.rel_l2(out, ref) <= ev.tol.rtol}
        if "affine" in accepted and affine_holds_widened(ev, ref, inputs):
            accepted.discard("affine")
            near.discard("affine")
        if other_ref is None:  # input_independent needs a second input set to be judged
            accepted.add("input_independent")
            near.add("input_independent")
        accepted_all &= accepted
        near_all &= near
        other_ref = ref
    return {"accepts": sorted(accepted_all), "near": sorted(near_all - accepted_all),
            "input_sensitivity": statistics.median(changes) if changes else None,
            "stochastic_ops": stochastic, "cost": cost}


def affine_holds_widened(ev: Evaluation, ref: list[torch.Tensor], inputs: list) -> bool:
    """Whether the affine fit made on these inputs also matches the reference on widened inputs
    (then the problem computes an affine function of its input: a real kernel does the same)."""
    fits = checks.affine_fit(ref, inputs)
    if fits is None:
        return False
    wide = widened(inputs, ev.new_seed())
    wide_ref = run_reference(ev.model, wide)
    return checks.compare(checks.apply_affine(fits, wide, wide_ref), wide_ref, ev.tol) is None


def problem_cost(model, inputs: list, outputs: list[torch.Tensor]) -> dict:
    """FLOPs of one forward (torch.utils.flop_counter: matmuls, convolutions, attention; None where it
    fails) and the bytes its inputs, weights and outputs occupy (what any kernel must move once)."""
    from torch.utils.flop_counter import FlopCounterMode

    flops = None
    try:
        counter = FlopCounterMode(display=False)
        with counter, torch.no_grad():
            model(*clone_inputs(inputs))
        flops = int(counter.get_total_flops())
    except Exception:
        pass
    weights = list(model.parameters()) + list(model.buffers())
    return {"flops": flops, "bytes": nbytes(inputs) + nbytes(weights) + nbytes(outputs)}


def reference_with_ops(model, inputs: list) -> tuple[list[torch.Tensor], list[str]]:
    """The reference's outputs, and the ATen ops (short names) it ran to get them."""
    record = OpRecord()
    with make_guard(record):
        outs = run_reference(model, inputs)
    return outs, sorted({short_name(n) for n in record.python_aten | record.cpp_aten})


# Ops whose result depends on an RNG: a task using them has no single right answer to check against.
STOCHASTIC_OPS = {"bernoulli", "bernoulli_", "native_dropout", "dropout", "feature_dropout", "alpha_dropout",
                  "feature_alpha_dropout", "rand", "rand_like", "randn", "randn_like", "randint", "randint_like",
                  "randperm", "normal", "normal_", "uniform_", "exponential_", "geometric_", "cauchy_",
                  "log_normal_", "random_", "multinomial", "poisson", "rrelu_with_noise", "_fused_dropout",
                  "_standard_gamma", "_sample_dirichlet", "binomial"}


def _check_task(ev: Evaluation, out: dict, a: list, b: list):
    """The filter's eager checks on two input sets, recorded in `out` stage by stage; the reference's
    outputs for b (what the compiled model must match) when all pass, else None (out names the stage
    that failed)."""
    req = ev.req
    t0 = time.perf_counter()
    ref_a, out["aten_ops"] = reference_with_ops(ev.model, a)
    rerun_a = None
    if req.slow_call_s is not None and synced_since(t0, req.device) > req.slow_call_s:
        # The first call also pays one-off costs (lazy kernel loading, library handles, the op
        # recorder) and shares the GPU with other judges: a warm call decides. Far outside the
        # window, the checks, compile and timing would only use up the task's timeout (a batched
        # SVD takes seconds a call) and slow every judge beside it.
        t0 = time.perf_counter()
        rerun_a = run_reference(ev.model, a)
        warm_s = synced_since(t0, req.device)
        if warm_s > req.slow_call_s:
            out["slow_call_s"] = warm_s
            return None
    stochastic = sorted(set(out["aten_ops"]) & STOCHASTIC_OPS)
    out.update(stage="ops", stochastic_ops=stochastic)
    if stochastic:
        return None
    out["stage"] = "outputs"
    out["output_shapes"] = [list(t.shape) for t in ref_a]
    out["empty"] = [i for i, t in enumerate(ref_a) if t.numel() == 0]
    out["non_finite"] = checks.non_finite(ref_a)
    if out["empty"] or out["non_finite"]:
        return None
    out["stage"] = "determinism"
    out["rerun_mismatch"] = checks.compare(run_reference(ev.model, a) if rerun_a is None else rerun_a, ref_a, ev.tol)
    if out["rerun_mismatch"]:
        return None
    out["stage"] = "outputs"
    ref_b = run_reference(ev.model, b)
    out["non_finite"] = checks.non_finite(ref_b)
    out["degenerate"] = [] if out["non_finite"] else checks.accepted_probes(ref_a, a, ref_b, ev.tol)
    if out["non_finite"] or out["degenerate"]:
        return None
    return ref_b


def measure_task(ev: Evaluation, timed: bool = True, checked: bool = False) -> dict:
    """What the dataset filter needs to know about a task, measured in this sandboxed process; the
    keep/drop decision is the driver's (`cudagym.synth.filter.decide`). Stops at the first failing
    stage and names it: eager, ops, determinism, outputs, compile, timing. Untimed (a GPU filter's
    first pass, `_check_and_compile`), a task that passes every check stops at stage "checked"; timed,
    `checked` (a GPU filter's second pass, the checks done in its first) skips the checks and only
    compiles and times. wait_s: seconds spent waiting
    for the GPU lock; slow_call_s: set when the first eager call and a warm one after it both took
    longer than the request's slow_call_s (then nothing else is measured)."""
    out: dict = {"stage": "eager", "wait_s": 0.0}
    try:
        constructed(ev, out)
        if timed:
            _measure_task(ev, out, checked)
        else:
            _check_and_compile(ev, out)
    except Exception as exc:  # the task's own failure, at the stage it reached
        out["error"] = f"{type(exc).__name__}: {exc}"[:400]
    return out


def constructed(ev: Evaluation, out: dict) -> None:
    """A filter task's model built on the CPU before its first GPU lock (`Evaluation.construct_model`),
    its seconds in out["construct_s"]; inputs_s is then its move to the device and the inputs."""
    t0 = time.perf_counter()
    ev.construct_model()
    out["construct_s"] = time.perf_counter() - t0


def _model_and_two_sets(ev: Evaluation, out: dict) -> tuple[list, int, list]:
    """The model and input sets a and b of a filter task, under the GPU lock: (a, b's seed, b)."""
    t0 = time.perf_counter()
    ev.build_model()
    a = make_inputs(ev.ref, ev.new_seed(), ev.req.device)
    seed_b = ev.new_seed()
    b = make_inputs(ev.ref, seed_b, ev.req.device)
    out["inputs_s"] = synced_since(t0, ev.req.device)
    return a, seed_b, b


def _check_and_compile(ev: Evaluation, out: dict) -> None:
    """A check task (a GPU filter's first pass, untimed): the eager checks on sets a and b, then the
    compile and its comparison on set b alone, with the share of the GPU memory budget lowered to what
    that holds (`Evaluation.lower_share`, "filter-compile"). The compile is most of a check task's time
    (CPU codegen, seconds under load), and holding the checks' three input sets and four output sets
    through it kept other judges waiting for memory nobody used: on the H100 (session 32) the check
    tasks' admission was 927 of their 1,733 judge-seconds in a round, their compile 590.
    Stops at stage "checked" when everything passes, else names the stage that failed."""
    req = ev.req
    t0 = time.perf_counter()
    with gpu_lock(req.lock_path, exclusive=req.exclusive):
        out["wait_s"] += time.perf_counter() - t0
        a, seed_b, b = _model_and_two_sets(ev, out)
        t0 = time.perf_counter()
        ref_b = _check_task(ev, out, a, b)
        out["checks_s"] = time.perf_counter() - t0
        if ref_b is None:
            return
    a = None  # with the checks' outputs gone (theirs were local), the compile holds b and ref_b alone
    ev.lower_share("filter-compile")
    out["stage"] = "compile"
    with autotuning_locked(req):
        compiled, out["compile_s"] = compile_reference(ev.model, [b], req.device)
    t0 = time.perf_counter()
    with gpu_lock(req.lock_path, exclusive=req.exclusive):
        out["wait_s"] += time.perf_counter() - t0
        # the compile's first call ran on b itself (no copy: the lowered share counts one set) and may
        # have written into it: the same set again from its seed, called once more without a copy
        b = None
        b = make_inputs(ev.ref, seed_b, req.device)
        with torch.no_grad():
            out["compile_mismatch"] = checks.compare(checks.as_tensor_list(compiled(*b)), ref_b, ev.tol)
    if not out["compile_mismatch"]:
        out["stage"] = "checked"


def _measure_task(ev: Evaluation, out: dict, checked: bool) -> None:
    req = ev.req
    t0 = time.perf_counter()
    with gpu_lock(req.lock_path, exclusive=req.exclusive):
        out["wait_s"] += time.perf_counter() - t0
        a, _, b = _model_and_two_sets(ev, out)
        if not checked:  # checked: a GPU filter's second pass, the checks done in its first
            t0 = time.perf_counter()
            ref_b = _check_task(ev, out, a, b)
            out["checks_s"] = time.perf_counter() - t0
            if ref_b is None:
                return
    # The compile outside the GPU lock, as a baseline's (`autotuning_locked`): held shared through
    # torch.compile's first call (a second, up to 18 s on the H200), it kept every judge waiting to
    # time waiting, in the filter's timing pass too, where each compile is a cache hit of seconds.
    out["stage"] = "compile"
    with autotuning_locked(req):
        compiled, out["compile_s"] = compile_reference(ev.model, [a], req.device)
    if not checked:  # pass 1 compiled this graph: pass 2's is the same
        t0 = time.perf_counter()
        with gpu_lock(req.lock_path, exclusive=req.exclusive):
            out["wait_s"] += time.perf_counter() - t0
            out["compile_mismatch"] = checks.compare(run_reference(compiled, b), ref_b, ev.tol)
        if out["compile_mismatch"]:
            return
    out["stage"] = "timing"
    t0 = time.perf_counter()
    with timing_turn(req):
        out["wait_s"] += time.perf_counter() - t0
        t0 = time.perf_counter()
        times = time_reference(ev.model, compiled, [a, b], req.device, req.timing_mode, req)
        out["timing_s"] = time.perf_counter() - t0  # time holding the GPU alone
    out.update(stage="done", t_eager_ms=times["t_eager_ms"], t_compile_ms=times.get("t_compile_ms"))


# A probe that may be faster than the request's fast_ms is timed under the shared lock first, beside the
# other judges' builds and checks; an answer under fast_ms ends it without a timing turn. Sharing the GPU
# only slows a kernel down (other processes' kernels take their time slices between its events, its L2 is
# flushed either way, its launches share the cores), so a time under fast_ms shared is under it alone too:
# the search would hear "too fast" from either. Probes waited a median 2.5-3.9 s for 0.04 s of timing
# (session 34, H100), and ~47% of 7,837 probes timed under the 1 ms floor. On the H100 (session 35), the
# probes timed both ways took a median 1.00x as long shared as alone (p10 0.99-1.00, p90 1.0-5.9).
# Which may be that fast: a warm call (synchronised wall time, launches included: at least its GPU time)
# under PROBE_SHARED_GATE x fast_ms, asked of a first call under PROBE_FIRST_CALL_GATE x fast_ms. A first
# call alone, gated at 20x, let 176 of 612 probes through (one-off costs: first calls took a median
# 30-150 ms in long-lived judges), and 101 were decided shared. The gates keep a probe that cannot be that
# fast from holding the shared lock through reps a timer would wait for.
PROBE_FIRST_CALL_GATE = 100.0
PROBE_SHARED_GATE = 4.0
# A probe's first call beyond this many times slow_call_s is not one-off costs (on the H200 those
# reached 5 s against the filter's 2 s limit): no warm call then (the scale search's monsters took 8-21 s a call).
PROBE_ONE_OFF_FACTOR = 5.0


def probe_task(ev: Evaluation) -> dict:
    """A scale-search probe: the task's eager time, roughly (a few reps: the search only needs to know
    where it lies against the window), nothing checked or compiled (a compile per probed scale cost
    the H200 more than every probe's timing; the filter checks and compiles the chosen scale). A first
    call beyond the request's slow_call_s gets a warm call, as in the filter (one-off costs), unless it
    took PROBE_ONE_OFF_FACTOR times that; a call still beyond it is the answer itself: far outside
    the window, its time tells the search how far, and timing reps of a batched SVD would cost seconds each.
    With the request's fast_ms, a probe that may be that fast is timed under the shared lock first
    (shared_ms; PROBE_SHARED_GATE): under fast_ms, that is the answer (decided "shared").
    The model is built on the CPU before the lock (construct_s), moved to the device under it.
    stage "done" with t_eager_ms (and slow_call_s when cut short), else the stage it failed at."""
    req, out = ev.req, {"stage": "eager", "wait_s": 0.0}
    try:
        constructed(ev, out)
        t0 = time.perf_counter()
        with gpu_lock(req.lock_path, exclusive=req.exclusive):  # shared: judges move to the GPU and warm up side by side
            out["wait_s"] += time.perf_counter() - t0
            t0 = time.perf_counter()
            ev.build_model()
            inputs = make_inputs(ev.ref, ev.new_seed(), req.device)
            out["inputs_s"] = time.perf_counter() - t0
            t0 = time.perf_counter()
            run_reference(ev.model, inputs)  # lazy kernel loading, library handles: not timed
            call_s = synced_since(t0, req.device)
            out["call_s"] = call_s  # where a probe wave's GPU time goes besides its timing: first calls, monsters
            if req.slow_call_s is not None and call_s > req.slow_call_s:  # a warm call decides, as in the filter
                if call_s <= PROBE_ONE_OFF_FACTOR * req.slow_call_s:
                    t0 = time.perf_counter()
                    run_reference(ev.model, inputs)
                    call_s = synced_since(t0, req.device)
                    out["call_s"] += call_s
                if call_s > req.slow_call_s:
                    out.update(stage="done", t_eager_ms=call_s * 1000, slow_call_s=call_s)
                    return out
            warm_ms = None
            if req.fast_ms is not None and call_s * 1000 < PROBE_FIRST_CALL_GATE * req.fast_ms:
                t0 = time.perf_counter()
                run_reference(ev.model, inputs)
                warm_ms = synced_since(t0, req.device) * 1000
                out["call_s"] += warm_ms / 1000
            if warm_ms is not None and warm_ms < PROBE_SHARED_GATE * req.fast_ms:
                t0 = time.perf_counter()
                shared = time_reference(ev.model, None, [inputs], req.device, req.timing_mode,
                                        dataclasses.replace(req, max_reps=req.min_reps))
                out["shared_s"] = time.perf_counter() - t0
                out["shared_ms"] = shared["t_eager_ms"]
                if shared["t_eager_ms"] < req.fast_ms:
                    out.update(stage="done", t_eager_ms=shared["t_eager_ms"], decided="shared")
                    return out
        out["stage"] = "timing"
        t0 = time.perf_counter()
        with timing_turn(req):
            out["wait_s"] += time.perf_counter() - t0
            t0 = time.perf_counter()
            times = time_reference(ev.model, None, [inputs], req.device, req.timing_mode, req)
            out["timing_s"] = time.perf_counter() - t0
        out.update(stage="done", t_eager_ms=times["t_eager_ms"])
    except Exception as exc:  # the task's own failure (out of memory at this scale, a bad shape)
        out["error"] = f"{type(exc).__name__}: {exc}"[:400]
    return out


def task_memory(ev: Evaluation) -> dict:
    """What a filter task reserved of the GPU's memory budget (`share_gib`, footprint_bytes' estimate), the
    share it lowered that to for its compile (`compile_gib`, check tasks), and the most its judge's
    allocator held while it ran (`peak_gib`; CUDA contexts apart, which the share counts as
    CONTEXT_BYTES): the estimate admits judges, so an estimate far above the peak keeps judges
    waiting for memory nobody uses. On the H100's 68 GiB budget the filter's checks, charged an
    evaluation's 14x their inputs, reserved a median 11.6 GiB (session 28, from the build's candidates on
    meta tensors): five such judges at once of sixteen. {} on the CPU."""
    if not ev.req.device.startswith("cuda") or ev.share_bytes is None:
        return {}
    memory = {"share_gib": round(ev.share_bytes / 2**30, 3),
              "peak_gib": round(torch.cuda.max_memory_allocated(ev.req.device) / 2**30, 3)}
    if ev.lowered_bytes is not None:  # what it held of the budget for its compile (`Evaluation.lower_share`)
        memory["compile_gib"] = round(ev.lowered_bytes / 2**30, 3)
    return memory


WARM_NICENESS = 10  # inherited by the compile workers of a warm judge


def process_age_s() -> float | None:
    """Seconds since this process started (its interpreter's start and imports, torch's among them, when
    asked at main's entry); None where /proc does not say."""
    try:
        with open("/proc/self/stat") as f:
            start_ticks = int(f.read().rpartition(")")[2].split()[19])  # field 22, starttime
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None


def main(argv: list[str]) -> int:
    from cudagym.tasks.sandbox import die_with_parent, isolate

    started_s = process_age_s()  # a judge's start, before its first task: what a pass of short tasks pays per judge
    if os.environ.get("CUDAGYM_EVAL_PID"):  # killed with the process that waits on it (an eval one SIGKILLed)
        die_with_parent(int(os.environ["CUDAGYM_EVAL_PID"]))
    request_path = argv[1]
    with open(request_path) as f:
        req = Request(**json.load(f))
    result_path = os.path.join(req.workdir, "result.json")
    if req.work_cpus:  # inherited by the candidate's process and compile workers
        os.sched_setaffinity(0, req.work_cpus)
    if req.mode == "warm":  # compiling ahead: the judges that time (and prepare to) come first for the CPU
        os.nice(WARM_NICENESS)
    sandbox = isolate(req.workdir, list(req.writable)) if os.environ.get("CUDAGYM_SANDBOX", "1") != "0" else "off"
    if req.device == "cpu":
        share_inductor_headers()
    os.environ["TMPDIR"] = tempfile.tempdir = req.workdir  # the only writable place besides the build caches
    if req.ref_codes is None and req.feed is None:
        result = evaluate_or_explain(req, sandbox)
    else:  # one line per task as it finishes: if this process dies, the driver keeps what is done
        released_s = None  # releasing the task before: reported with the next (its line is written by then)
        with open(os.path.join(req.workdir, "results.jsonl"), "w") as lines:
            for code, tags, last in (fed_tasks(req) if req.feed else listed_tasks(req, lines)):
                t0 = time.perf_counter()
                result = evaluate_or_explain(dataclasses.replace(req, ref_code=code, mode=tags.pop("mode", req.mode),
                                                                 defer_memory_s=None if last else req.defer_memory_s),
                                             sandbox)
                result.update(tags)
                # the task's whole time in this judge: its phases and whatever none of them names (loading the
                # reference, the memory reservation's bookkeeping), so a pass line shows what is unaccounted for
                result["task_s"] = round(time.perf_counter() - t0, 3)
                if released_s is not None:
                    result["release_s"] = released_s
                if started_s is not None:  # the judge's start, on its first task: summed over a pass's judges
                    result["start_s"], started_s = started_s, None
                lines.write(json.dumps(result) + "\n")
                lines.flush()
                if result.get("compiled_elsewhere") or result.get("deferred"):  # nothing was built: nothing to release
                    released_s = None
                    continue
                t0 = time.perf_counter()
                if not release_task_memory():
                    break  # a sticky CUDA error: the driver reruns the remaining tasks, each in a new process
                released_s = round(time.perf_counter() - t0, 3)
        result = {"status": "done"}
        if req.mode in ("warm", "baseline"):
            save_compile_artifacts()
    with open(result_path, "w") as f:
        json.dump(result, f)
    return 0


def listed_tasks(req: Request, lines):
    """The tasks of a judge's list (`ref_codes`) that it runs: (code, tags for its result line, whether it is
    the list's last). With a queue, each only once claimed; a task another judge took is a line
    {"claimed_elsewhere": true}, so line i stays task i's."""
    for i, code in enumerate(req.ref_codes):
        if req.queue and not claim_task(req.queue, req.claim_keys[i], req.claim_token):
            lines.write(json.dumps({"claimed_elsewhere": True}) + "\n")
            lines.flush()
            continue
        yield code, {}, i == len(req.ref_codes) - 1  # deferring the last task gains nothing


FEED_POLL_S = 0.05  # how often an idle fed judge looks for the next item: a probe's wait, not a CPU's load


def fed_tasks(req: Request):
    """The tasks of a feed (cudagym.eval.feed) that this judge claims, as the driver adds them: item n is
    `feed.item_path` ({"key", "code"}, and "mode" where the item runs in another mode than the judge's request,
    written whole by a rename), taken in order; the feed ends when every item is seen and the driver's `end`
    mark is there. (code, {"feed_key": key} and the item's "mode", False): a fed judge never knows a task to
    be its last."""
    n = 0
    while True:
        item = item_path(req.feed, n)
        try:
            with open(item) as f:
                entry = json.load(f)
        except FileNotFoundError:
            if os.path.exists(os.path.join(req.feed, END_MARK)) and not os.path.exists(item):
                return
            time.sleep(FEED_POLL_S)
            continue
        n += 1
        if claim_task(req.feed, entry["key"], req.claim_token):
            yield entry["code"], {"feed_key": entry["key"], **({"mode": entry["mode"]} if "mode" in entry else {})}, False


def save_compile_artifacts() -> None:
    """A baseline judge's compiles, cache hits included, for `cudagym baseline cache export`
    (`compile_cache`), beside the shared inductor cache. Never fails the judge: the baselines are stored."""
    cache = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if not cache:
        return
    from cudagym.eval.compile_cache import ARTIFACTS, save_artifacts

    try:
        save_artifacts(os.path.join(cache, ARTIFACTS))
    except Exception as exc:
        print(f"compile artifacts not saved: {type(exc).__name__}: {exc}"[:300], file=sys.stderr)


def share_inductor_headers() -> None:
    """Inductor builds its C++ precompiled headers (CPU kernels) under tempfile.gettempdir(), read
    once when its codecache is imported. Import it while that points at the shared inductor cache,
    not at this judge's workdir, so the headers are built once for all judges, not once per judge."""
    cache = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if not cache:
        return
    saved, tempfile.tempdir = tempfile.tempdir, cache
    try:
        importlib.import_module("torch._inductor.codecache")
    finally:
        tempfile.tempdir = saved


def release_cached_memory(device: str) -> None:
    """Give the caching allocator's free blocks back between phases: a multi-GB problem's phases
    allocate different shapes, and cached blocks of one are memory the next cannot use."""
    if device.startswith("cuda"):
        gc.collect()
        torch.cuda.empty_cache()


def release_task_memory() -> bool:
    """Between the tasks of one judge: dynamo's caches hold the last task's compiled graph and so its
    weights, and the caching allocator keeps freed blocks; both would outlive the task's reservation.
    False when the CUDA context is broken (an illegal access is sticky), so the process must stop."""
    gc.collect()
    torch._dynamo.reset()
    if torch.cuda.is_initialized():
        try:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
        except Exception:
            return False
    return True


def evaluate_or_explain(req: Request, sandbox: str) -> dict:
    try:
        result = evaluate(req)
        result.setdefault("env", {})["judge_sandbox"] = sandbox
        return result
    except Exception as exc:  # the reference or the harness failed: not a verdict on the candidate, but still a verdict
        return {"status": "runtime_error", "reason": f"evaluation failed: {type(exc).__name__}: {exc}"[:500],
                "judge_error": True, "trace": traceback.format_exc()[-3000:]}


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
