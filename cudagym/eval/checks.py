"""Output checks, run in the judge (the candidate's process never sees reference outputs).

Pure tensor functions: structure and tolerance (`compare`), degenerate probes (`PROBES`,
`accepted_probes`) and the precision check against a float64 reference (`precision_error`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch


@dataclass(frozen=True)
class Tolerance:
    atol: float = 1e-2  # CUDA Agent / KernelBench parity
    rtol: float = 1e-2


STRICT_TOLERANCE = Tolerance(1e-4, 1e-4)


def as_tensor_list(out) -> list[torch.Tensor]:
    """A forward's result as a flat list; raises TypeError on anything but exact tensors."""
    items = list(out) if isinstance(out, (tuple, list)) else [out]
    for i, t in enumerate(items):
        if type(t) is not torch.Tensor:  # exact type: a subclass can lie in comparisons or compute lazily
            raise TypeError(f"output {i} is {type(t).__module__}.{type(t).__qualname__}, not torch.Tensor")
    return items


def structure_mismatch(cand: list[torch.Tensor], ref: list[torch.Tensor]) -> str | None:
    if len(cand) != len(ref):
        return f"{len(cand)} outputs, expected {len(ref)}"
    for i, (c, r) in enumerate(zip(cand, ref)):
        if c.dtype != r.dtype:
            return f"output {i} dtype {c.dtype}, expected {r.dtype}"
        if tuple(c.shape) != tuple(r.shape):
            return f"output {i} shape {tuple(c.shape)}, expected {tuple(r.shape)}"
        if c.device != r.device:
            return f"output {i} on {c.device}, expected {r.device}"
    return None


def non_finite(outputs: list[torch.Tensor]) -> list[int]:
    """Indices of the float or complex outputs holding a NaN or an infinity."""
    return [i for i, t in enumerate(outputs) if (t.is_floating_point() or t.is_complex()) and not bool(torch.isfinite(t).all())]


def compare(cand: list[torch.Tensor], ref: list[torch.Tensor], tol: Tolerance) -> str | None:
    """None if cand matches ref (structure, finiteness, |c - r| <= atol + rtol |r|), else the reason."""
    mismatch = structure_mismatch(cand, ref)
    if mismatch:
        return mismatch
    for i, (c, r) in enumerate(zip(cand, ref)):
        if c.is_floating_point() or c.is_complex():
            if non_finite([c]):
                return f"output {i} has non-finite values"
            # In the outputs' own dtype, like torch.allclose: float64 copies of multi-GB outputs cost
            # memory and time and change nothing at a tolerance of 1e-2.
            diff = (c - r).abs_()
            if not bool((diff <= r.abs().mul_(tol.rtol).add_(tol.atol)).all()):
                return f"output {i} max abs diff {diff.max().item():.3g} exceeds tolerance (atol={tol.atol}, rtol={tol.rtol})"
        elif not torch.equal(c, r):
            return f"output {i} ({c.dtype}) differs from reference"
    return None


def rel_l2(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    """||a - b|| / ||b|| over all outputs together (float outputs only)."""
    num = den = 0.0
    for x, y in zip(a, b):
        if y.is_floating_point():
            num += float(torch.linalg.vector_norm((x.to(y.dtype) - y).flatten(), dtype=torch.float64)) ** 2
            den += float(torch.linalg.vector_norm(y.flatten(), dtype=torch.float64)) ** 2
    return (num ** 0.5) / (den ** 0.5) if den > 0 else (0.0 if num == 0 else float("inf"))


# Degenerate answers. A problem whose check accepts one cannot tell a real kernel from a trivial one
# on its input domain, so the judge then also demands relative-L2 agreement on a widened domain.
ProbeFn = Callable[[list[torch.Tensor], list, list[torch.Tensor] | None], list[torch.Tensor] | None]
PROBES: dict[str, ProbeFn] = {}


def probe(name: str):
    def register(fn: ProbeFn) -> ProbeFn:
        PROBES[name] = fn
        return fn
    return register


# The probes' float64 statistics go through these, a piece at a time: a float64 copy of a multi-GB
# output is twice its size, and on a GPU shared by many judges that is an out-of-memory error (v0.1
# L1/36 RMSNorm, 7.5 GB in and out, asked for 14 GiB more here). Probe answers that are one number
# per output (or per row) are broadcast views, not tensors of the output's size.
CHUNK_ELEMENTS = 1 << 24


def float64_pieces(*tensors: torch.Tensor):
    """Matching flat pieces of same-sized tensors, each as float64."""
    flat = [t.reshape(-1) for t in tensors]
    for start in range(0, flat[0].numel(), CHUNK_ELEMENTS):
        yield [f[start:start + CHUNK_ELEMENTS].double() for f in flat]


def mean64(t: torch.Tensor) -> float:
    return sum(float(x.sum()) for (x,) in float64_pieces(t)) / max(1, t.numel())


def broadcast(value: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return value.to(device=like.device, dtype=like.dtype).expand_as(like)


@probe("zeros")
def _zeros(ref, inputs, other_ref):
    return [broadcast(r.new_zeros(()), r) for r in ref]


@probe("constant")
def _constant(ref, inputs, other_ref):
    return [broadcast(torch.tensor(mean64(r), dtype=torch.float64), r) if r.is_floating_point() else r.clone() for r in ref]


@probe("passthrough")
def _passthrough(ref, inputs, other_ref):
    tensors = [x for x in inputs if isinstance(x, torch.Tensor)]
    out = []
    for r in ref:
        match = next((x for x in tensors if x.shape == r.shape and x.dtype == r.dtype), None)
        if match is None:
            return None
        out.append(match)
    return out


@probe("mean")
def _mean(ref, inputs, other_ref):
    """Each output replaced by its mean over the last dim (what a reduction-free 'normalised' cheat gives)."""
    return [broadcast(row_means64(r), r) if r.is_floating_point() and r.dim() and r.numel() else r for r in ref]


def row_means64(r: torch.Tensor) -> torch.Tensor:
    """r's float64 means over its last dim (keepdim), computed a block of rows at a time."""
    rows = r.reshape(-1, r.shape[-1])
    step = max(1, CHUNK_ELEMENTS // rows.shape[1])
    means = torch.cat([rows[s:s + step].double().mean(dim=-1) for s in range(0, rows.shape[0], step)])
    return means.reshape(*r.shape[:-1], 1)


def affine_fit(ref: list[torch.Tensor], inputs: list) -> list[tuple[int, float, float]] | None:
    """For each output, the input of its shape and dtype and the scalars (a, b) of the least-squares
    fit output ~ a * input + b; None where some output has no such input."""
    tensors = [(i, x) for i, x in enumerate(inputs) if isinstance(x, torch.Tensor) and x.is_floating_point()]
    fits = []
    for r in ref:
        match = next(((i, x) for i, x in tensors if x.shape == r.shape and x.dtype == r.dtype), None)
        if match is None or not r.is_floating_point():
            return None
        i, x = match
        mx, mr = mean64(x), mean64(r)
        var = cov = 0.0  # centred sums in float64, a piece at a time (see float64_pieces)
        for xd, rd in float64_pieces(x, r):
            # out of place: a float64 tensor's piece is a view of it (.double() copies nothing), and
            # these are the task's inputs and the reference's outputs
            xc = xd - mx
            var += float((xc * xc).sum())
            cov += float((xc * (rd - mr)).sum())
        a = cov / var if var > 0 else 0.0
        fits.append((i, a, mr - a * mx))
    return fits


def apply_affine(fits: list[tuple[int, float, float]], inputs: list, like: list[torch.Tensor]) -> list[torch.Tensor]:
    # In the input's own dtype (the output's, by affine_fit's match): one tensor of the output's size
    return [inputs[i].mul(a).add_(b).to(r.dtype) for (i, a, b), r in zip(fits, like)]


@probe("affine")
def _affine(ref, inputs, other_ref):
    """a * input + b with two scalars: what skipping a normalisation's statistics gives on i.i.d.
    inputs (BatchNorm of torch.rand is (x - 0.5) / 0.289 per channel, at any batch)."""
    fits = affine_fit(ref, inputs)
    return None if fits is None else apply_affine(fits, inputs, ref)


@probe("input_independent")
def _input_independent(ref, inputs, other_ref):
    return other_ref  # the reference output for a different input set


def accepted_probes(ref: list[torch.Tensor], inputs: list, other_ref: list[torch.Tensor] | None,
                    tol: Tolerance) -> list[str]:
    """Names of the probes whose output passes `compare` against ref on these inputs."""
    accepted = []
    for name, fn in PROBES.items():
        out = fn(ref, inputs, other_ref)
        if out is not None and compare(out, ref, tol) is None:
            accepted.append(name)
    return accepted


def precision_error(cand: list[torch.Tensor], ref32: list[torch.Tensor], ref64: list[torch.Tensor]) -> tuple[float, float]:
    """(candidate's, fp32 reference's) relative L2 error against the float64 reference."""
    return rel_l2(cand, ref64), rel_l2(ref32, ref64)


def is_downcast(err_cand: float, err_ref32: float) -> bool:
    """fp16/bf16/tf32 arithmetic lands at >= ~2e-4 relative error; honest fp32 far below, and within
    a small factor of the reference's own fp32 error even with another summation order."""
    return err_cand > max(1e-4, 30 * err_ref32)


def degenerate_reason(row: dict, tol: Tolerance = Tolerance()) -> str | None:
    """Why a problem's check cannot tell a real kernel from a trivial one, from its audit row
    (`cudagym audit`: `accepts`, `near`, `stochastic`, `input_sensitivity`); None when it can.
    Such problems are marked on the leaderboard and left out of its metrics by default."""
    reasons = []
    if row.get("accepts"):
        reasons.append(f"its check accepts {', '.join(row['accepts'])} (atol={tol.atol:g}, rtol={tol.rtol:g})")
    near = [p for p in row.get("near") or [] if p not in (row.get("accepts") or [])]
    if near:
        sens = row.get("input_sensitivity")
        detail = f"; output changes by {sens:.1e} (rel. L2) between input sets" if isinstance(sens, (int, float)) else ""
        reasons.append(f"its output is within {tol.rtol:g} (rel. L2) of {', '.join(near)}{detail}")
    if row.get("stochastic"):
        reasons.append(f"its reference is random ({', '.join(row['stochastic'][:3])})")
    return "; ".join(reasons) or None


def change_mismatch(outs_amp: list[torch.Tensor], ref_amp: list[torch.Tensor], ref_base: list[torch.Tensor],
                    err_base: list[torch.Tensor | None], tol: Tolerance, frac: float) -> str | None:
    """Whether a candidate's outputs follow the reference's change between two input sets, element
    by element: |dc - dr| <= frac |dr| + (atol + rtol |r|) / 10, with dr the reference's change and
    dc the candidate's; dc - dr is (cand - ref) on the second set less (cand - ref) on the first
    (`err_base`). Honest fp32 kernels are orders of magnitude inside; a kernel that estimated a
    statistic from part of its input moves by the wrong amount wherever that statistic moved.
    Works in place (multi-GB outputs): it overwrites outs_amp, ref_amp and ref_base."""
    for i, (c, ra, rb, eb) in enumerate(zip(outs_amp, ref_amp, ref_base, err_base)):
        if eb is None:
            continue
        miss = c.sub_(ra).sub_(eb).abs_()  # |dc - dr|
        bound = rb.sub_(ra).abs_().mul_(frac).add_(ra.abs_().mul_(tol.rtol / 10).add_(tol.atol / 10))
        bad = miss > bound
        n_bad = int(bad.sum())
        if n_bad:
            worst = float((miss - bound).max())
            return f"output {i}: {n_bad} of {c.numel()} elements, by up to {worst:.3g} beyond the bound"
    return None
