"""Stage 1 of synth: crawl seed operators from torch and transformers.

Every public callable of `torch.nn` (modules), `torch.nn.functional`, `torch` (+ `torch.special`,
`torch.linalg`, `torch.fft`) and the operators of `torch.Tensor` is looked up in curated tables of
argument/shape rules, one table per family (pointwise, reductions, normalisations, convs/pools,
matmul, losses, ...). A callable with a rule becomes a candidate `Seed`; every candidate is verified
by rendering its KernelBench-format task and running it on meta tensors and on small real CPU inputs
(twice, to catch randomness). Seeds are our own code and run in-process. A callable without a rule,
an excluded one (stochastic, in-place, data-dependent output shape, ...) or one that fails
verification is a `Skip` with a reason code, never an exception.

What a seed is (`Seed`, `InputSpec`, `Skip`, the symbolic dims `DIMS`) lives in `synth/seeds.py`;
rendering a seed's task in `synth/render.py`; its labels in `synth/labels.py`. This module imports
them, never `compose` (which builds on it).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib
import inspect
import logging
import os
import pickle
import re
import sys
import threading
import warnings
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Iterable

from cudagym.synth.labels import ops_from_code
from cudagym.synth.render import seed_task
from cudagym.synth.seeds import (  # noqa: F401 - re-exported: crawl was their home
    ANY,
    DIMS,
    DOMAIN_ACCEPTS,
    DOMAIN_DTYPES,
    DOMAINS,
    KINDS,
    LIKE_X,
    P2,
    P3,
    P4,
    P5,
    R2,
    SEQ,
    InputSpec,
    Seed,
    Skip,
)

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------------------------
# Rule tables
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Rule:
    call: str  # "FN" stands for the namespaced callable (torch.sum, F.gelu, ...)
    inputs: tuple[InputSpec, ...]
    accepts: tuple = ()
    modules: tuple[tuple[str, str], ...] = ()
    out_domain: str = "real"
    name: str = ""
    variant: str = ""


def _x(shape: tuple = P4, domain: str = "randn", high: str | int | None = None) -> InputSpec:
    return InputSpec("x", shape, domain, high)


def _in(name: str, shape: tuple = LIKE_X, domain: str = "randn", high: str | int | None = None) -> InputSpec:
    return InputSpec(name, shape, domain, high)


def _param(name: str, shape: tuple, domain: str = "randn") -> InputSpec:
    return InputSpec(name, shape, domain, param=True)


def fn(call: str, *extra: InputSpec, x: InputSpec | None = None, accepts: tuple = (), out: str = "real",
       name: str = "", variant: str = "") -> Rule:
    """A function rule: call template, primary input x, extra inputs; accepts defaults to x's shape."""
    return Rule(call, ((x or _x()),) + extra, accepts, out_domain=out, name=name, variant=variant)


def mod(init: str, *extra: InputSpec, x: InputSpec | None = None, accepts: tuple = (), call: str = "self.op(x)",
        out: str = "real") -> Rule:
    """A module rule: constructor template in slot `op`, forward call template."""
    return Rule(call, ((x or _x()),) + extra, accepts, modules=(("op", init),), out_domain=out)


def unary(domain: str = "randn", out: str = "real", args: str = "") -> Rule:
    return fn(f"FN(x{args})", x=_x(P4, domain), accepts=ANY, out=out)


def binary(other: str = "randn", x: str = "randn", out: str = "real", args: str = "") -> Rule:
    return fn(f"FN(x, other{args})", _in("other", LIKE_X, other), x=_x(P4, x), accepts=ANY, out=out)


def along(args: str = ", dim=1", suffix: str = "", out: str = "real", accepts: tuple = R2) -> Rule:
    """An op along dim 1 (reductions, scans, sort/topk, softmax) of a rank >= 2 input."""
    return fn(f"FN(x{args}){suffix}", accepts=accepts, out=out)


POINTWISE = {
    "abs": unary(), "acos": unary("unit"), "acosh": unary("gt1", "positive"), "asin": unary("unit"),
    "asinh": unary(), "atan": unary(), "atanh": unary("unit"), "ceil": unary(), "cos": unary(out="unit"),
    "cosh": unary(out="positive"), "deg2rad": unary(), "digamma": unary("positive"), "erf": unary(out="unit"),
    "erfc": unary(out="positive"), "erfinv": unary("unit"), "exp": unary(out="positive"),
    "exp2": unary(out="positive"), "expm1": unary(), "floor": unary(), "frac": unary(),
    "lgamma": unary("positive"), "log": unary("positive"), "log10": unary("positive"),
    "log1p": unary("positive"), "log2": unary("positive"), "logit": unary("probability"),
    "i0": unary(out="positive"), "nan_to_num": unary(), "neg": unary(), "rad2deg": unary(),
    "reciprocal": unary("positive", "positive"), "round": unary(), "rsqrt": unary("positive", "positive"),
    "sign": unary(), "sgn": unary(), "sin": unary(out="unit"), "sinc": unary(), "sinh": unary(),
    "sqrt": unary("positive", "positive"), "square": unary(), "tan": unary("unit"), "trunc": unary(),
    "signbit": unary(), "clamp": unary(args=", min=-0.5, max=0.5"), "clamp_min": unary(args=", -0.5"),
    "clamp_max": unary(args=", 0.5"), "mvlgamma": unary("gt1", args=", p=2"),
    "polygamma": fn("FN(1, x)", x=_x(P4, "positive"), accepts=ANY),
    # torch.special
    "erfcx": unary(out="positive"), "i0e": unary(out="positive"), "i1": unary(), "i1e": unary(),
    "ndtr": unary(out="probability"), "ndtri": unary("probability"), "log_ndtr": unary(),
    "entr": unary("positive"), "bessel_j0": unary(), "bessel_j1": unary(), "bessel_y0": unary("positive"),
    "bessel_y1": unary("positive"), "modified_bessel_i0": unary(out="positive"), "modified_bessel_i1": unary(),
    "modified_bessel_k0": unary("positive"), "modified_bessel_k1": unary("positive"),
    "scaled_modified_bessel_k0": unary("positive"), "scaled_modified_bessel_k1": unary("positive"),
    "spherical_bessel_j0": unary(), "airy_ai": unary(),
    # torch.fft on real inputs with real outputs
    "fftshift": unary(), "ifftshift": unary(), "irfft": unary(), "hfft": unary(),
}

ACTIVATIONS = {
    "relu": unary(), "relu6": unary(), "selu": unary(), "celu": unary(), "elu": unary(), "gelu": unary(),
    "silu": unary(), "mish": unary(), "sigmoid": unary(out="probability"), "tanh": unary(out="unit"),
    "leaky_relu": unary(args=", 0.1"), "hardtanh": unary(), "hardswish": unary(), "hardsigmoid": unary(),
    "hardshrink": unary(), "softshrink": unary(), "tanhshrink": unary(), "softsign": unary(out="unit"),
    "softplus": unary(out="positive"), "logsigmoid": unary(), "threshold": unary(args=", 0.1, 0.0"),
    "glu": unary(), "prelu": fn("FN(x, weight)", _param("weight", (1,)), accepts=ANY),
}

BINARY = {
    "add": binary(), "sub": binary(), "rsub": binary(), "mul": binary(), "div": binary("positive"),
    "floor_divide": binary("positive"), "remainder": binary("positive"), "fmod": binary("positive"),
    "pow": binary(x="positive"), "float_power": binary(x="positive"), "atan2": binary(),
    "hypot": binary(out="positive"), "maximum": binary(), "minimum": binary(), "fmax": binary(), "fmin": binary(),
    "copysign": binary(), "nextafter": binary(), "logaddexp": binary(), "logaddexp2": binary(),
    "xlogy": binary("positive"), "xlog1py": binary("positive"), "zeta": binary("positive", "gt1"),
    "igamma": binary("positive", "positive", "probability"), "igammac": binary("positive", "positive", "probability"),
    "heaviside": binary(), "ldexp": binary(), "lerp": binary(args=", 0.3"), "dist": binary(),
    "eq": binary(), "ne": binary(), "gt": binary(), "ge": binary(), "lt": binary(), "le": binary(),
    "isclose": binary(), "logical_and": binary(), "logical_or": binary(), "logical_xor": binary(),
    "addcmul": fn("FN(x, tensor1, tensor2, value=0.5)", _in("tensor1"), _in("tensor2"), accepts=ANY),
    "addcdiv": fn("FN(x, tensor1, tensor2, value=0.5)", _in("tensor1"), _in("tensor2", domain="positive"),
                  accepts=ANY),
    "where": fn("FN(condition, x, other)", _in("condition", domain="bool"), _in("other"), accepts=ANY),
    "masked_fill": fn("FN(x, mask, 0.0)", _in("mask", domain="bool"), accepts=ANY),
    "kron": fn("FN(x, other)", _in("other", (2, 2)), x=_x(("B", "C")), accepts=("_", "_")),
    "cross": fn("FN(x, other, dim=1)", _in("other"), x=_x(("B", 3)), accepts=("_", 3)),
    "vecdot": fn("FN(x, other, dim=-1)", _in("other"), x=_x(SEQ), accepts=ANY),
}

REDUCTIONS = {
    "sum": along(), "mean": along(), "prod": along(), "amax": along(), "amin": along(), "nansum": along(),
    "nanmean": along(), "std": along(), "var": along(), "logsumexp": along(), "norm": along(),
    "vector_norm": along(), "matrix_norm": fn("FN(x)", accepts=R2), "count_nonzero": along(),
    "all": along(), "any": along(), "argmax": along(), "argmin": along(), "max": along(suffix=".values"),
    "min": along(suffix=".values"), "median": along(suffix=".values"), "nanmedian": along(suffix=".values"),
    "mode": along(suffix=".values"), "std_mean": along(suffix="[0]"), "var_mean": along(suffix="[0]"),
    "aminmax": along(suffix=".min"), "kthvalue": along(", 2, dim=1", ".values"),
    "quantile": along(", 0.5, dim=1"), "nanquantile": along(", 0.5, dim=1"),
    "histc": fn("FN(x, bins=16, min=-3.0, max=3.0)", accepts=ANY),
    "trace": fn("FN(x)", x=_x(("M", "N")), accepts=("_", "_")),
}

SCANS_AND_SORTS = {
    "cumsum": along(), "cumprod": along(), "logcumsumexp": along(), "cummax": along(suffix=".values"),
    "cummin": along(suffix=".values"), "softmax": along(out="probability"), "log_softmax": along(out="logprob"),
    "softmin": along(out="probability"), "normalize": along(out="unit"), "renorm": along(", 2, 1, 1.0"),
    "sort": along(suffix=".values"), "argsort": along(), "msort": fn("FN(x)", accepts=ANY),
    "topk": along(", 4, dim=1", ".values"), "diff": along(), "trapezoid": along(), "cumulative_trapezoid": along(),
    "searchsorted": fn("FN(boundaries, x)", _in("boundaries", ("K",), "sorted"), accepts=ANY),
    "bucketize": fn("FN(x, boundaries)", _in("boundaries", ("K",), "sorted"), accepts=ANY),
}

LAYOUT = {
    "flatten": along(", 1"), "unflatten": along(", 1, (2, -1)"), "ravel": fn("FN(x)", accepts=ANY),
    "reshape": fn("FN(x, (B, -1))", accepts=("B", "...")), "permute": fn("FN(x, (0, 2, 3, 1))", accepts=("_",) * 4),
    "movedim": along(", 1, -1"), "transpose": fn("FN(x, 1, 2)", accepts=("_", "_", "_", "...")),
    "t": fn("FN(x)", x=_x(("M", "N")), accepts=("_", "_")),
    "squeeze": fn("FN(x, 1)", x=_x(("B", 1, "I")), accepts=("_", 1, "...")),
    "unsqueeze": fn("FN(x, 1)", accepts=ANY), "narrow": along(", 1, 0, 2"), "select": along(", 1, 0"),
    "chunk": along(", 2, dim=1", "[0]"), "split": along(", 2, dim=1", "[0]"),
    "tensor_split": along(", 2, dim=1", "[0]"), "unbind": along(", dim=1", "[0]"),
    "hsplit": along(", 2", "[0]"), "vsplit": along(", 2", "[0]"),
    "dsplit": fn("FN(x, 2)[0]", accepts=("_", "_", "_", "...")),
    "stack": fn("FN([x, other], dim=1)", _in("other"), accepts=ANY),
    "cat": fn("FN([x, other], dim=1)", _in("other"), accepts=R2),
    "hstack": fn("FN([x, other])", _in("other"), accepts=ANY), "vstack": fn("FN([x, other])", _in("other"), accepts=ANY),
    "dstack": fn("FN([x, other])", _in("other"), accepts=ANY),
    "column_stack": fn("FN([x, other])", _in("other"), accepts=ANY), "tile": fn("FN(x, (1, 2))", accepts=ANY),
    "repeat_interleave": along(", 2, dim=1"), "roll": along(", 1, 1"), "flip": along(", (1,)"),
    "fliplr": fn("FN(x)", accepts=R2), "flipud": fn("FN(x)", accepts=ANY), "rot90": fn("FN(x, 1, (-2, -1))", accepts=R2),
    "tril": fn("FN(x)", accepts=R2), "triu": fn("FN(x)", accepts=R2), "diagonal": fn("FN(x, 0, -2, -1)", accepts=R2),
    "diag_embed": fn("FN(x)", accepts=ANY), "diag": fn("FN(x)", x=_x(("M", "N")), accepts=("_", "_")),
    "diagflat": fn("FN(x)", x=_x(("K",)), accepts=("_",)),
    "block_diag": fn("FN(x, other)", _in("other", ("N", "N")), x=_x(("M", "K")), accepts=("_", "_")),
}

INDEXING = {
    "gather": fn("FN(x, 1, index)", _in("index", LIKE_X, "index", high="C"), accepts=("B", "C", "...")),
    "take_along_dim": fn("FN(x, index, dim=1)", _in("index", LIKE_X, "index", high="C"), accepts=("B", "C", "...")),
    "index_select": fn("FN(x, 1, index)", _in("index", (4,), "perm", high="C"), accepts=("B", "C", "...")),
    "index_fill": fn("FN(x, 1, index, -1.0)", _in("index", (4,), "perm", high="C"), accepts=("B", "C", "...")),
    "index_add": fn("FN(x, 1, index, source)", _in("index", (4,), "perm", high="C"), _in("source", ("B", 4, "H", "W")),
                    accepts=P4),
    "index_copy": fn("FN(x, 1, index, source)", _in("index", (4,), "perm", high="C"), _in("source", ("B", 4, "H", "W")),
                     accepts=P4),
    "index_reduce": fn("FN(x, 1, index, source, 'amax')", _in("index", (4,), "perm", high="C"),
                       _in("source", ("B", 4, "H", "W")), accepts=P4),
    "scatter_add": fn("FN(x, 1, index, src)", _in("index", LIKE_X, "index", high="C"), _in("src"),
                      accepts=("B", "C", "...")),
    "scatter_reduce": fn("FN(x, 1, index, src, reduce='amax')", _in("index", LIKE_X, "index", high="C"), _in("src"),
                         accepts=("B", "C", "...")),
    "embedding": fn("FN(x, weight)", _param("weight", ("V", "E")), x=_x(("B", "S"), "index", "V")),
    "embedding_bag": fn("FN(x, weight, mode='mean')", _param("weight", ("V", "E")), x=_x(("B", "S"), "index", "V")),
    "one_hot": fn("FN(x, Q)", x=_x(("B",), "index", "Q")),
}

MATMUL = {
    "mm": fn("FN(x, other)", _in("other", ("K", "N")), x=_x(("M", "K")), accepts=("_", "K")),
    "matmul": fn("FN(x, other)", _in("other", ("K", "N")), x=_x(("B", "M", "K")), accepts=("...", "K")),
    "bmm": fn("FN(x, other)", _in("other", ("B", "K", "N")), x=_x(("B", "M", "K")), accepts=("B", "_", "K")),
    "addmm": fn("FN(bias, x, other)", _in("bias", ("N",)), _in("other", ("K", "N")), x=_x(("M", "K")), accepts=("_", "K")),
    "addbmm": fn("FN(bias, x, other)", _in("bias", ("M", "N")), _in("other", ("B", "K", "N")), x=_x(("B", "M", "K"))),
    "baddbmm": fn("FN(bias, x, other)", _in("bias", ("B", "M", "N")), _in("other", ("B", "K", "N")), x=_x(("B", "M", "K"))),
    "addmv": fn("FN(bias, x, vec)", _in("bias", ("M",)), _in("vec", ("K",)), x=_x(("M", "K"))),
    "mv": fn("FN(x, vec)", _in("vec", ("K",)), x=_x(("M", "K")), accepts=("_", "K")),
    "addr": fn("FN(bias, x, other)", _in("bias", ("M", "N")), _in("other", ("N",)), x=_x(("M",))),
    "outer": fn("FN(x, other)", _in("other", ("N",)), x=_x(("M",)), accepts=("_",)),
    "dot": fn("FN(x, other)", _in("other"), x=_x(("K",)), accepts=("_",)),
    "vdot": fn("FN(x, other)", _in("other"), x=_x(("K",)), accepts=("_",)),
    "inner": fn("FN(x, other)", _in("other", ("N", "K")), x=_x(("B", "K")), accepts=("...", "K")),
    "tensordot": fn("FN(x, other, dims=1)", _in("other", ("K", "N")), x=_x(("B", "M", "K")), accepts=("...", "K")),
    "einsum": fn("FN('bij,bjk->bik', x, other)", _in("other", ("B", "K", "N")), x=_x(("B", "M", "K")),
                 accepts=("B", "_", "K")),
    "multi_dot": fn("FN([x, other, third])", _in("other", ("K", "N")), _in("third", ("N", "M")), x=_x(("M", "K")),
                    accepts=("_", "K")),
    "cdist": fn("FN(x, other)", _in("other", ("B", "N", "K")), x=_x(("B", "M", "K")), accepts=("B", "_", "K")),
    "pdist": fn("FN(x)", x=_x(("M", "K")), accepts=("_", "_")),
    "pairwise_distance": fn("FN(x, other)", _in("other"), x=_x(P2), accepts=ANY),
    "cosine_similarity": fn("FN(x, other, dim=1)", _in("other"), x=_x(P2), accepts=R2, out="unit"),
    "linear": fn("FN(x, weight, bias)", _param("weight", ("J", "I")), _param("bias", ("J",)), x=_x(P2),
                 accepts=("...", "I")),
    # channel-sized: torch.bilinear on CPU is pathologically slow at (64 x 40 -> 128)
    "bilinear": fn("FN(x, other, weight, bias)", _in("other"), _param("weight", ("O", "C", "C")),
                   _param("bias", ("O",)), x=_x(("B", "C"))),
    "scaled_dot_product_attention": fn("FN(x, key, value)", _in("key"), _in("value"), x=_x(("B", 4, "S", "E")),
                                       accepts=("...", "S", "E")),
}

LINALG = {  # square inputs are symmetric positive definite ("spd") where the op needs it
    "det": fn("FN(x)", x=_x(("B", 6, 6), "spd")),  # 6x6: larger SPD determinants overflow float32
    "logdet": fn("FN(x)", x=_x(("B", "N", "N"), "spd")),
    "slogdet": fn("FN(x).logabsdet", x=_x(("B", "N", "N"), "spd")), "inv": fn("FN(x)", x=_x(("B", "N", "N"), "spd")),
    "cholesky": fn("FN(x)", x=_x(("B", "N", "N"), "spd")), "eigvalsh": fn("FN(x)", x=_x(("B", "N", "N"), "spd")),
    "solve": fn("FN(x, rhs)", _in("rhs", ("B", "N", "K")), x=_x(("B", "N", "N"), "spd")),
    "svdvals": fn("FN(x)", x=_x(("B", "M", "K")), accepts=("...", "_", "_")),
    "pinv": fn("FN(x)", x=_x(("B", "M", "K")), accepts=("...", "_", "_")),
    "matrix_exp": fn("FN(x)", x=_x(("B", "N", "N"), "unit"), accepts=("...", "N", "N")),
    "matrix_power": fn("FN(x, 3)", x=_x(("B", "N", "N"), "unit"), accepts=("...", "N", "N")),
    "cov": fn("FN(x)", x=_x(("M", "N")), accepts=("_", "_")),
    "corrcoef": fn("FN(x)", x=_x(("M", "N")), accepts=("_", "_")),
}

CONV_POOL = {
    "conv1d": fn("FN(x, weight, bias)", _param("weight", ("O", "C", 3)), _param("bias", ("O",)), x=_x(P3),
                 accepts=("B", "C", "_")),
    "conv2d": fn("FN(x, weight, bias)", _param("weight", ("O", "C", 3, 3)), _param("bias", ("O",)),
                 accepts=("B", "C", "_", "_")),
    "conv3d": fn("FN(x, weight, bias)", _param("weight", ("O", "C", 3, 3, 3)), _param("bias", ("O",)), x=_x(P5),
                 accepts=("B", "C", "_", "_", "_")),
    "conv_transpose1d": fn("FN(x, weight, bias, stride=2)", _param("weight", ("C", "O", 3)), _param("bias", ("O",)),
                           x=_x(P3), accepts=("B", "C", "_")),
    "conv_transpose2d": fn("FN(x, weight, bias, stride=2)", _param("weight", ("C", "O", 3, 3)), _param("bias", ("O",)),
                           accepts=("B", "C", "_", "_")),
    "conv_transpose3d": fn("FN(x, weight, bias, stride=2)", _param("weight", ("C", "O", 3, 3, 3)),
                           _param("bias", ("O",)), x=_x(P5), accepts=("B", "C", "_", "_", "_")),
    "unfold": fn("FN(x, kernel_size=3)", accepts=("_",) * 4),
    "fold": fn("FN(x, output_size=(8, 8), kernel_size=2, stride=2)", x=_x(("B", "4*C", 16)), accepts=("_", "_", 16)),
    "pad": fn("FN(x, (1, 1, 1, 1))", accepts=("...", "_", "_")),
    "interpolate": fn("FN(x, scale_factor=2.0, mode='nearest')", accepts=("_",) * 4),
    "pixel_shuffle": fn("FN(x, 2)", accepts=("_",) * 4), "pixel_unshuffle": fn("FN(x, 2)", accepts=("_",) * 4),
    "channel_shuffle": fn("FN(x, 2)", accepts=("_",) * 4),
    "grid_sample": fn("FN(x, grid, align_corners=False)", _in("grid", ("B", 8, 8, 2), "unit"), accepts=("B", "_", "_", "_")),
    "affine_grid": fn("FN(x, (B, C, 8, 8), align_corners=False)", x=_x(("B", 2, 3))),
}
for _nd, _shape in ((1, P3), (2, P4), (3, P5)):
    _acc = ("_",) * len(_shape)
    CONV_POOL.update({
        f"avg_pool{_nd}d": fn("FN(x, 2)", x=_x(_shape), accepts=_acc),
        f"max_pool{_nd}d": fn("FN(x, 2)", x=_x(_shape), accepts=_acc),
        f"max_pool{_nd}d_with_indices": fn("FN(x, 2)[0]", x=_x(_shape), accepts=_acc),
        f"lp_pool{_nd}d": fn("FN(x, 2.0, 2)", x=_x(_shape), accepts=_acc),
        f"adaptive_avg_pool{_nd}d": fn("FN(x, 4)", x=_x(_shape), accepts=_acc),
        f"adaptive_max_pool{_nd}d": fn("FN(x, 4)", x=_x(_shape), accepts=_acc),
        f"adaptive_max_pool{_nd}d_with_indices": fn("FN(x, 4)[0]", x=_x(_shape), accepts=_acc),
    })

NORMS = {
    "layer_norm": fn("FN(x, (E,), weight, bias)", _param("weight", ("E",)), _param("bias", ("E",)), x=_x(SEQ),
                     accepts=("...", "E")),
    "rms_norm": fn("FN(x, (E,), weight)", _param("weight", ("E",)), x=_x(SEQ), accepts=("...", "E")),
    "group_norm": fn("FN(x, 4, weight, bias)", _param("weight", ("C",)), _param("bias", ("C",)), accepts=("B", "C", "...")),
    "batch_norm": fn("FN(x, running_mean, running_var, weight, bias)", _param("running_mean", ("C",)),
                     _param("running_var", ("C",), "positive"), _param("weight", ("C",)), _param("bias", ("C",)),
                     accepts=("B", "C", "...")),
    "instance_norm": fn("FN(x)", accepts=("B", "C", "_", "...")),
    "local_response_norm": fn("FN(x, 2)", accepts=("B", "C", "_", "...")),
}

LOSSES = {
    "l1_loss": binary(), "mse_loss": binary(), "smooth_l1_loss": binary(), "huber_loss": binary(),
    "soft_margin_loss": binary("sign"), "hinge_embedding_loss": binary("sign"), "poisson_nll_loss": binary("positive"),
    "binary_cross_entropy": binary("probability", "probability"), "binary_cross_entropy_with_logits": binary("probability"),
    "gaussian_nll_loss": fn("FN(x, target, var)", _in("target"), _in("var", domain="positive"), accepts=ANY),
    "kl_div": fn("FN(x, target, reduction='batchmean')", _in("target", domain="probability"),
                 x=_x(("B", "Q"), "logprob"), accepts=("_", "_")),
    "cross_entropy": fn("FN(x, target)", _in("target", ("B",), "index", "Q"), x=_x(("B", "Q"))),
    "nll_loss": fn("FN(x, target)", _in("target", ("B",), "index", "Q"), x=_x(("B", "Q"), "logprob")),
    "multi_margin_loss": fn("FN(x, target)", _in("target", ("B",), "index", "Q"), x=_x(("B", "Q"))),
    "multilabel_margin_loss": fn("FN(x, target)", _in("target", LIKE_X, "index", "Q"), x=_x(("B", "Q"))),
    "multilabel_soft_margin_loss": fn("FN(x, target)", _in("target", domain="binary"), x=_x(("B", "Q")), accepts=("_", "_")),
    "margin_ranking_loss": fn("FN(x, other, target)", _in("other"), _in("target", domain="sign"), x=_x(("B",)),
                              accepts=("_",)),
    "cosine_embedding_loss": fn("FN(x, other, target)", _in("other"), _in("target", ("B",), "sign"), x=_x(P2)),
    "triplet_margin_loss": fn("FN(x, positive, negative)", _in("positive"), _in("negative"), x=_x(P2), accepts=("B", "_")),
    "triplet_margin_with_distance_loss": fn("FN(x, positive, negative)", _in("positive"), _in("negative"), x=_x(P2),
                                            accepts=("B", "_")),
}

FUNCTION_FAMILIES: dict[str, dict[str, Rule]] = {
    "pointwise": POINTWISE, "activation": ACTIVATIONS, "binary": BINARY, "reduction": REDUCTIONS,
    "scan_sort": SCANS_AND_SORTS, "layout": LAYOUT, "indexing": INDEXING, "matmul": MATMUL, "linalg": LINALG,
    "conv_pool": CONV_POOL, "norm": NORMS, "loss": LOSSES,
}

# Operators of torch.Tensor in their Python-operator form; variants give the KernelBench level-2
# idioms (bias add, scaling) distinct seeds.
TENSOR_OPS: dict[str, Rule] = {
    "__add__": fn("x + other", _in("other"), accepts=ANY),
    "__add__#bias": fn("x + bias", _param("bias", ("C", 1, 1)), accepts=("B", "C", "_", "_"), name="BiasAdd",
                       variant="bias"),
    "__sub__": fn("x - other", _in("other"), accepts=ANY),
    "__sub__#scalar": fn("x - 0.5", accepts=ANY, name="Subtract", variant="scalar"),
    "__mul__": fn("x * other", _in("other"), accepts=ANY),
    "__mul__#scalar": fn("x * 0.5", accepts=ANY, name="Scaling", variant="scalar"),
    "__mul__#channel": fn("x * scale", _param("scale", ("C", 1, 1)), accepts=("B", "C", "_", "_"), name="ChannelScale",
                          variant="channel"),
    "__truediv__": fn("x / other", _in("other", domain="positive"), accepts=ANY),
    "__truediv__#scalar": fn("x / 2.0", accepts=ANY, name="Divide", variant="scalar"),
    "__pow__#square": fn("x ** 2", accepts=ANY, name="Square", variant="square"),
    "__matmul__": fn("x @ other", _in("other", ("K", "N")), x=_x(("B", "M", "K")), accepts=("...", "K")),
    "__neg__": fn("-x", accepts=ANY),
    "repeat": fn("x.repeat(1, 2, 1, 1)", accepts=("_",) * 4),
}

# Module rules: constructor template + forward call.
_LOSS_MODULES = {
    "L1Loss": "l1_loss", "MSELoss": "mse_loss", "SmoothL1Loss": "smooth_l1_loss", "HuberLoss": "huber_loss",
    "SoftMarginLoss": "soft_margin_loss", "HingeEmbeddingLoss": "hinge_embedding_loss", "PoissonNLLLoss": "poisson_nll_loss",
    "BCELoss": "binary_cross_entropy", "BCEWithLogitsLoss": "binary_cross_entropy_with_logits",
    "GaussianNLLLoss": "gaussian_nll_loss", "CrossEntropyLoss": "cross_entropy", "NLLLoss": "nll_loss",
    "MultiMarginLoss": "multi_margin_loss", "MultiLabelMarginLoss": "multilabel_margin_loss",
    "MultiLabelSoftMarginLoss": "multilabel_soft_margin_loss", "MarginRankingLoss": "margin_ranking_loss",
    "CosineEmbeddingLoss": "cosine_embedding_loss", "TripletMarginLoss": "triplet_margin_loss",
    "TripletMarginWithDistanceLoss": "triplet_margin_with_distance_loss",
}


def _loss_module(cls: str, function: str, init_args: str = "") -> Rule:
    """The module twin of a functional loss: same inputs, `self.op(<inputs>)` in place of `FN(...)`."""
    rule = LOSSES[function]
    call = "self.op(" + ", ".join(spec.name for spec in rule.inputs) + ")"
    return Rule(call, rule.inputs, rule.accepts, modules=(("op", f"nn.{cls}({init_args})"),))


_ACTIVATION_MODULES = {  # class -> (constructor args, output domain)
    "ReLU": ("", "real"), "ReLU6": ("", "real"), "SELU": ("", "real"), "CELU": ("", "real"), "ELU": ("", "real"),
    "GELU": ("approximate='tanh'", "real"), "SiLU": ("", "real"), "Mish": ("", "real"),
    "Sigmoid": ("", "probability"), "Tanh": ("", "unit"), "LeakyReLU": ("0.1", "real"),
    "Hardtanh": ("-0.5, 0.5", "real"), "Hardswish": ("", "real"), "Hardsigmoid": ("", "real"),
    "Hardshrink": ("0.5", "real"), "Softshrink": ("0.5", "real"), "Tanhshrink": ("", "real"),
    "Softsign": ("", "unit"), "Softplus": ("beta=1.0, threshold=20.0", "positive"), "LogSigmoid": ("", "real"),
    "Threshold": ("0.1, 0.0", "real"), "GLU": ("", "real"), "PReLU": ("", "real"),
}

MODULES: dict[str, Rule] = {
    **{cls: mod(f"nn.{cls}({args})", accepts=ANY, out=out) for cls, (args, out) in _ACTIVATION_MODULES.items()},
    "KLDivLoss": _loss_module("KLDivLoss", "kl_div", "reduction='batchmean'"),
    **{cls: _loss_module(cls, f) for cls, f in _LOSS_MODULES.items()},
    "Softmax": mod("nn.Softmax(dim=1)", accepts=R2, out="probability"),
    "LogSoftmax": mod("nn.LogSoftmax(dim=1)", accepts=R2, out="logprob"),
    "Softmin": mod("nn.Softmin(dim=1)", accepts=R2, out="probability"),
    "Softmax2d": mod("nn.Softmax2d()", accepts=("_",) * 4, out="probability"),
    "Linear": mod("nn.Linear(I, J)", x=_x(P2), accepts=("...", "I")),
    "Bilinear": mod("nn.Bilinear(C, C, O)", _in("other"), x=_x(("B", "C")), call="self.op(x, other)"),
    "Conv1d": mod("nn.Conv1d(C, O, 3)", x=_x(P3), accepts=("B", "C", "_")),
    "Conv2d": mod("nn.Conv2d(C, O, 3)", accepts=("B", "C", "_", "_")),
    "Conv3d": mod("nn.Conv3d(C, O, 3)", x=_x(P5), accepts=("B", "C", "_", "_", "_")),
    "ConvTranspose1d": mod("nn.ConvTranspose1d(C, O, 3, stride=2)", x=_x(P3), accepts=("B", "C", "_")),
    "ConvTranspose2d": mod("nn.ConvTranspose2d(C, O, 3, stride=2)", accepts=("B", "C", "_", "_")),
    "ConvTranspose3d": mod("nn.ConvTranspose3d(C, O, 3, stride=2)", x=_x(P5), accepts=("B", "C", "_", "_", "_")),
    "BatchNorm1d": mod("nn.BatchNorm1d(C)", x=_x(P3), accepts=("B", "C", "_")),
    "BatchNorm2d": mod("nn.BatchNorm2d(C)", accepts=("B", "C", "_", "_")),
    "BatchNorm3d": mod("nn.BatchNorm3d(C)", x=_x(P5), accepts=("B", "C", "_", "_", "_")),
    "InstanceNorm1d": mod("nn.InstanceNorm1d(C, affine=True)", x=_x(P3), accepts=("B", "C", "_")),
    "InstanceNorm2d": mod("nn.InstanceNorm2d(C, affine=True)", accepts=("B", "C", "_", "_")),
    "InstanceNorm3d": mod("nn.InstanceNorm3d(C, affine=True)", x=_x(P5), accepts=("B", "C", "_", "_", "_")),
    "GroupNorm": mod("nn.GroupNorm(4, C)", accepts=("B", "C", "...")),
    "LayerNorm": mod("nn.LayerNorm(E)", x=_x(SEQ), accepts=("...", "E")),
    "RMSNorm": mod("nn.RMSNorm(E)", x=_x(SEQ), accepts=("...", "E")),
    "LocalResponseNorm": mod("nn.LocalResponseNorm(2)", accepts=("B", "C", "_", "...")),
    "CrossMapLRN2d": mod("nn.CrossMapLRN2d(3)", accepts=("_",) * 4),
    "Upsample": mod("nn.Upsample(scale_factor=2.0, mode='nearest')", accepts=("_",) * 4),
    "UpsamplingNearest2d": mod("nn.UpsamplingNearest2d(scale_factor=2.0)", accepts=("_",) * 4),
    "UpsamplingBilinear2d": mod("nn.UpsamplingBilinear2d(scale_factor=2.0)", accepts=("_",) * 4),
    "PixelShuffle": mod("nn.PixelShuffle(2)", accepts=("_",) * 4),
    "PixelUnshuffle": mod("nn.PixelUnshuffle(2)", accepts=("_",) * 4),
    "ChannelShuffle": mod("nn.ChannelShuffle(2)", accepts=("_",) * 4),
    "Unfold": mod("nn.Unfold(kernel_size=3)", accepts=("_",) * 4),
    "Fold": mod("nn.Fold(output_size=(8, 8), kernel_size=2, stride=2)", x=_x(("B", "4*C", 16)), accepts=("_", "_", 16)),
    "Flatten": mod("nn.Flatten()", accepts=R2),
    "Unflatten": mod("nn.Unflatten(1, (2, -1))", accepts=R2),
    "PairwiseDistance": mod("nn.PairwiseDistance()", _in("other"), x=_x(P2), accepts=ANY, call="self.op(x, other)"),
    "CosineSimilarity": mod("nn.CosineSimilarity(dim=1)", _in("other"), x=_x(P2), accepts=R2, call="self.op(x, other)",
                            out="unit"),
    "Embedding": mod("nn.Embedding(V, E)", x=_x(("B", "S"), "index", "V")),
    "EmbeddingBag": mod("nn.EmbeddingBag(V, E, mode='mean')", x=_x(("B", "S"), "index", "V")),
    "RNN": mod("nn.RNN(I, E, batch_first=True)", x=_x(("B", "S", "I")), accepts=("_", "_", "I"), call="self.op(x)[0]"),
    "LSTM": mod("nn.LSTM(I, E, batch_first=True)", x=_x(("B", "S", "I")), accepts=("_", "_", "I"), call="self.op(x)[0]"),
    "GRU": mod("nn.GRU(I, E, batch_first=True)", x=_x(("B", "S", "I")), accepts=("_", "_", "I"), call="self.op(x)[0]"),
    "RNNCell": mod("nn.RNNCell(I, J)", x=_x(P2), accepts=("_", "I")),
    "LSTMCell": mod("nn.LSTMCell(I, J)", x=_x(P2), accepts=("_", "I"), call="self.op(x)[0]"),
    "GRUCell": mod("nn.GRUCell(I, J)", x=_x(P2), accepts=("_", "I")),
    "MultiheadAttention": mod("nn.MultiheadAttention(E, 4, batch_first=True)", x=_x(SEQ), accepts=("_", "_", "E"),
                              call="self.op(x, x, x)[0]"),
    "TransformerEncoderLayer": mod("nn.TransformerEncoderLayer(E, 4, dim_feedforward=J, dropout=0.0, batch_first=True)",
                                   x=_x(SEQ), accepts=("_", "_", "E")),
    "TransformerDecoderLayer": mod("nn.TransformerDecoderLayer(E, 4, dim_feedforward=J, dropout=0.0, batch_first=True)",
                                   _in("memory"), x=_x(SEQ), accepts=("_", "_", "E"), call="self.op(x, memory)"),
    "TransformerEncoder": mod("nn.TransformerEncoder(nn.TransformerEncoderLayer(E, 4, dim_feedforward=J, dropout=0.0, "
                              "batch_first=True), num_layers=2, enable_nested_tensor=False)",
                              x=_x(SEQ), accepts=("_", "_", "E")),
    "TransformerDecoder": mod("nn.TransformerDecoder(nn.TransformerDecoderLayer(E, 4, dim_feedforward=J, dropout=0.0, "
                              "batch_first=True), num_layers=2)", _in("memory"), x=_x(SEQ), accepts=("_", "_", "E"),
                              call="self.op(x, memory)"),
    "Transformer": mod("nn.Transformer(E, 4, num_encoder_layers=1, num_decoder_layers=1, dim_feedforward=J, dropout=0.0, "
                       "batch_first=True)", _in("tgt"), x=_x(SEQ), accepts=("_", "_", "E"), call="self.op(x, tgt)"),
    "AdaptiveLogSoftmaxWithLoss": mod("nn.AdaptiveLogSoftmaxWithLoss(I, Q, cutoffs=[4, 8])",
                                      _in("target", ("B",), "index", "Q"), x=_x(P2), accepts=("B", "I"),
                                      call="self.op(x, target).output"),
}
for _nd, _shape in ((1, P3), (2, P4), (3, P5)):
    _acc, _bc = ("_",) * len(_shape), ("B", "C") + ("_",) * (_nd)
    MODULES.update({
        f"MaxPool{_nd}d": mod(f"nn.MaxPool{_nd}d(2)", x=_x(_shape), accepts=_acc),
        f"AvgPool{_nd}d": mod(f"nn.AvgPool{_nd}d(2)", x=_x(_shape), accepts=_acc),
        f"LPPool{_nd}d": mod(f"nn.LPPool{_nd}d(2.0, 2)", x=_x(_shape), accepts=_acc),
        f"AdaptiveAvgPool{_nd}d": mod(f"nn.AdaptiveAvgPool{_nd}d(4)", x=_x(_shape), accepts=_acc),
        f"AdaptiveMaxPool{_nd}d": mod(f"nn.AdaptiveMaxPool{_nd}d(4)", x=_x(_shape), accepts=_acc),
        f"ZeroPad{_nd}d": mod(f"nn.ZeroPad{_nd}d(1)", x=_x(_shape), accepts=_acc),
        f"ConstantPad{_nd}d": mod(f"nn.ConstantPad{_nd}d(1, 0.5)", x=_x(_shape), accepts=_acc),
        f"ReflectionPad{_nd}d": mod(f"nn.ReflectionPad{_nd}d(1)", x=_x(_shape), accepts=_acc),
        f"ReplicationPad{_nd}d": mod(f"nn.ReplicationPad{_nd}d(1)", x=_x(_shape), accepts=_acc),
        f"CircularPad{_nd}d": mod(f"nn.CircularPad{_nd}d(1)", x=_x(_shape), accepts=_acc),
    })

# Names that never become seeds, with the reason. Checked in order, against the short name.
EXCLUSIONS: list[tuple[str, str, str]] = [
    ("inplace", r"^(?!__).*[a-z0-9]_$|^__i(add|sub|mul|truediv|floordiv|mod|pow|matmul|and|or|xor|lshift|rshift)__$",
     "in-place only"),
    ("stochastic", r"(?i)dropout|^rand|bernoulli|multinomial|^normal$|^poisson$|gumbel|rrelu|fractional_?max_?pool"
                   r"|^uniform$|cauchy|exponential|geometric|log_normal|binomial|dirichlet|seed$",
     "random by design (or in training mode)"),
    ("data_dependent_shape", r"^(nonzero|nonzero_static|unique|unique_consecutive|masked_select|argwhere|bincount)$",
     "output shape depends on the input values"),
    ("nondeterministic", r"^(scatter|index_put|put|masked_scatter)$",
     "duplicate indices make the result depend on write order"),
    ("complex_output", r"^(complex|polar|view_as_complex|stft|istft|eig|eigvals|fft|ifft|rfft|ihfft|fft2|ifft2|rfft2"
                       r"|ihfft2|fftn|ifftn|rfftn|ihfftn)$", "complex-valued output"),
    ("non_unique_output", r"^(qr|svd|eigh|lu|lu_factor|lu_factor_ex|ldl_factor|ldl_factor_ex|householder_product"
                          r"|svd_lowrank|pca_lowrank|lobpcg)$",
     "factors are unique only up to sign/permutation"),
    ("constant_output", r"^(isnan|isinf|isfinite|isneginf|isposinf|isreal|logical_not|.*_like|angle)$",
     "output is constant for finite real inputs"),
    ("factory", r"^(zeros|ones|empty|full|arange|range|linspace|logspace|eye|tensor|as_tensor|asarray|as_strided"
                r"|from_numpy|frombuffer|from_file|empty_strided|empty_permuted|scalar_tensor|tril_indices|triu_indices"
                r"|fftfreq|rfftfreq|.*_window|vander)$", "builds a tensor without a tensor input"),
    ("container", r"^(Sequential|ModuleList|ModuleDict|ParameterList|ParameterDict|Container)$", "a container module"),
    ("abstract", r"^Module$", "the base class"),
    ("lazy", r"^Lazy", "infers its sizes on first call; the eager form is crawled"),
    ("needs_distributed", r"^SyncBatchNorm$", "needs a process group"),
    ("trivial", r"^(Identity|positive|clone|atleast_1d|atleast_2d|atleast_3d|conj|conj_physical|resolve_conj"
                r"|resolve_neg|detach|alias_copy|fix)$", "returns its input (or a copy)"),
    ("integer_only", r"^(bitwise_.*|gcd|lcm|__and__|__or__|__xor__|__lshift__|__rshift__|__invert__)$",
     "defined for integer/bool tensors only"),
    ("internal", r"^(native_.*|.*_copy|q_.*|quantize.*|fake_quantize.*|fbgemm_.*|mkldnn_.*|cudnn_.*|miopen_.*|.*_backward"
                 r"|batch_norm_.*|sym_.*|segment_reduce|is_.*|dequantize|choose_qparams.*)$",
     "aten internal, predicate or backend-specific entry point"),
    ("cpu_only", r"^(histogram|histogramdd)$", "no CUDA kernel"),
    ("reflected_operator", r"^__r[a-z]+__$", "same op as the non-reflected operator"),
]
_EXCLUSIONS = [(reason, re.compile(pattern), detail) for reason, pattern, detail in EXCLUSIONS]

# Different names for the same op (the first name is crawled, these are skipped).
ALIASES: dict[str, str] = {
    "arccos": "acos", "arccosh": "acosh", "arcsin": "asin", "arcsinh": "asinh", "arctan": "atan", "arctanh": "atanh",
    "arctan2": "atan2", "absolute": "abs", "negative": "neg", "multiply": "mul", "divide": "div", "subtract": "sub",
    "true_divide": "div", "clip": "clamp", "greater": "gt", "greater_equal": "ge", "less": "lt", "less_equal": "le",
    "not_equal": "ne", "concat": "cat", "concatenate": "cat", "swapaxes": "transpose", "swapdims": "transpose",
    "moveaxis": "movedim", "row_stack": "vstack", "ger": "outer", "trapz": "trapezoid", "expit": "sigmoid",
    "psi": "digamma", "gammaln": "lgamma", "multigammaln": "mvlgamma", "inverse": "inv", "pinverse": "pinv",
    "chain_matmul": "multi_dot", "orgqr": "householder_product", "adjoint": "transpose", "matrix_transpose": "transpose",
}


def exclusion(name: str) -> tuple[str, str] | None:
    for reason, pattern, detail in _EXCLUSIONS:
        if pattern.search(name):
            return reason, detail
    return None


# --------------------------------------------------------------------------------------------
# Verification
# --------------------------------------------------------------------------------------------


class SeedError(Exception):
    """A seed's task failed a verification check; `reason` is the Skip reason code."""

    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason, self.detail = reason, detail


_SINGLE_THREADED = threading.Lock()
_single_threaded_users = 0
_threads_before = 0


@contextlib.contextmanager
def single_threaded():
    """One intra-op thread: tiny tensors run ~50x faster than with threads contending on a busy box.
    The setting is the process's: counted across Python threads (a streamed build composes the next
    round on a thread of its own while this one is sized), the first in sets it, the last out restores it."""
    import torch

    global _single_threaded_users, _threads_before
    with _SINGLE_THREADED:
        if _single_threaded_users == 0:
            _threads_before = torch.get_num_threads()
            torch.set_num_threads(1)
        _single_threaded_users += 1
    try:
        yield
    finally:
        with _SINGLE_THREADED:
            _single_threaded_users -= 1
            if _single_threaded_users == 0:
                torch.set_num_threads(_threads_before)


def exec_task(code: str) -> dict[str, Any]:
    """Exec trusted task source (our own seeds/compositions) and return its namespace."""
    namespace: dict[str, Any] = {"__name__": "cudagym_synth_task"}
    exec(compile(code, "<synth-task>", "exec"), namespace)
    return namespace


def run_namespace(namespace: dict[str, Any], device: str, seed: int = 0):
    """Build Model and inputs on `device` and run forward once (no grad); returns (model, inputs, out)."""
    import torch

    torch.manual_seed(seed)
    with torch.device(device), torch.no_grad():
        model = namespace["Model"](*namespace["get_init_inputs"]())
        if device == "meta":
            shapes_only_rnns(model)
        inputs = namespace["get_inputs"]()
        out = model(*inputs)
    if not isinstance(out, torch.Tensor):
        raise SeedError("non_tensor_output", f"forward returned {type(out).__name__}")
    return model, inputs, out


def shapes_only_rnns(model) -> None:
    """Give the model's nn.LSTM, nn.GRU and nn.RNN modules a forward that makes their outputs' shapes
    only (`rnn_meta_forward`), for shape inference on meta tensors. torch runs a recurrent layer on
    meta tensors step by step through its decomposition: composing 150 candidates took 73 s on the CPU,
    39 s of them in 7 LSTM calls. Subclasses with a forward of their own keep it."""
    import torch.nn as nn

    plain = (nn.LSTM.forward, nn.GRU.forward, nn.RNN.forward)
    for module in model.modules():
        if type(module).forward in plain:
            module.forward = functools.partial(rnn_meta_forward, module)


def rnn_meta_forward(module, input, hx=None):
    """nn.LSTM / GRU / RNN forward on a meta tensor without running it: the module's own input checks
    (the same errors), then empty outputs of the shapes and dtype its forward returns. Anything else
    (a given hidden state, a packed sequence, real tensors) goes to the module's forward."""
    import torch

    if hx is not None or not isinstance(input, torch.Tensor) or input.device.type != "meta":
        return type(module).forward(module, input, hx)
    if input.dim() not in (2, 3):
        raise ValueError(f"{type(module).__name__}: Expected input to be 2D or 3D, got {input.dim()}D instead")
    batch_dim = 0 if module.batch_first else 1
    x = input if input.dim() == 3 else input.unsqueeze(batch_dim)
    module.check_input(x, None)
    directions = 2 if module.bidirectional else 1
    out_size = module.proj_size if module.proj_size > 0 else module.hidden_size
    layers, batch = directions * module.num_layers, x.shape[batch_dim]
    output = x.new_empty((*x.shape[:-1], directions * out_size))
    states = [x.new_empty((layers, batch, out_size))]
    if isinstance(module, torch.nn.LSTM):
        states.append(x.new_empty((layers, batch, module.hidden_size)))
    if input.dim() == 2:  # unbatched in, unbatched out
        output, states = output.squeeze(batch_dim), [h.squeeze(1) for h in states]
    return (output, tuple(states)) if isinstance(module, torch.nn.LSTM) else (output, states[0])


def infer_output(code: str, try_meta: bool = True, max_cpu_numel: int | None = None,
                 max_tensor_numel: int | None = None) -> tuple[tuple[int, ...], str, bool]:
    """(output shape, dtype, whether meta tensors sufficed) of a task: meta first, CPU if meta fails.
    A task whose weights and inputs hold more than max_cpu_numel elements is not run on the CPU (at
    GPU scale that run would take minutes and gigabytes): ValueError instead. So is a task with any
    one input or weight of more than max_tensor_numel elements, checked on meta tensors first."""
    namespace = exec_task(code)
    numels = tensor_numels(namespace) if max_tensor_numel is not None else None  # reused by the CPU bound
    if numels is not None and max(numels, default=0) > max_tensor_numel:
        raise ValueError(f"an input or weight of more than {max_tensor_numel} elements")
    if try_meta:
        try:
            _, _, out = run_namespace(namespace, "meta")
            return tuple(out.shape), str(out.dtype).removeprefix("torch."), True
        except SeedError:
            raise
        except Exception:  # noqa: BLE001 - no meta kernel, or a real error the CPU run reports
            pass
    if max_cpu_numel is not None and (sum(numels) if numels is not None else task_numel(namespace)) > max_cpu_numel:
        raise ValueError(f"too large for shape inference on the CPU (more than {max_cpu_numel} elements)")
    _, _, out = run_namespace(namespace, "cpu")
    return tuple(out.shape), str(out.dtype).removeprefix("torch."), False


def tensor_numels(namespace: dict[str, Any]) -> list[int]:
    """Elements of each of a task's weights, buffers and inputs, counted on meta tensors (no memory,
    no compute)."""
    import torch

    with torch.device("meta"):
        model = namespace["Model"](*namespace["get_init_inputs"]())
        inputs = namespace["get_inputs"]()
    tensors = list(model.parameters()) + list(model.buffers()) + [x for x in inputs if isinstance(x, torch.Tensor)]
    return [t.numel() for t in tensors]


def task_numel(namespace: dict[str, Any]) -> int:
    """Elements in a task's weights and inputs."""
    return sum(tensor_numels(namespace))


def verify(seed: Seed) -> Seed:
    """Run the seed's task on meta tensors and twice on small CPU inputs; record what it produced.
    Raises SeedError(reason, detail) when a check fails."""
    import torch

    try:
        task = seed_task(seed)
    except Exception as e:  # noqa: BLE001
        raise SeedError("render_error", f"{type(e).__name__}: {e}") from None
    ops = tuple(ops_from_code(task.code))
    if not ops:
        raise SeedError("no_op_label", "the task's AST names no operator")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            namespace = exec_task(task.code)
        except Exception as e:  # noqa: BLE001
            raise SeedError("render_error", f"{type(e).__name__}: {e}") from None
        meta_shape, meta_error = None, ""
        try:
            meta_shape = tuple(run_namespace(namespace, "meta")[2].shape)
        except SeedError:
            raise
        except Exception as e:  # noqa: BLE001
            meta_error = f"{type(e).__name__}: {str(e)[:160]}"
        try:
            with torch.device("cpu"), torch.no_grad():
                models = []
                for _ in range(2):  # two constructions under one seed must give the same weights
                    torch.manual_seed(0)
                    models.append(namespace["Model"](*namespace["get_init_inputs"]()))
                    states = [{k: v.clone() for k, v in m.state_dict().items()} for m in models]
                inputs = namespace["get_inputs"]()
                out, again = models[0](*inputs), models[0](*inputs)
        except Exception as e:  # noqa: BLE001
            raise SeedError("failed_cpu", f"{type(e).__name__}: {str(e)[:200]}") from None
    for key, a in states[0].items():
        b = states[1][key]
        if not (torch.equal(a, b) or (a.is_floating_point() and torch.allclose(a, b, rtol=0, atol=0, equal_nan=True))):
            raise SeedError("nondeterministic_init", f"{key} differs between two constructions under one seed")
    if not isinstance(out, torch.Tensor):
        raise SeedError("non_tensor_output", f"forward returned {type(out).__name__}")
    deprecations = [str(w.message) for w in caught
                    if issubclass(w.category, (DeprecationWarning, FutureWarning)) or "deprecat" in str(w.message).lower()]
    if deprecations:
        raise SeedError("deprecated", deprecations[0][:200])
    if out.is_complex():
        raise SeedError("complex_output", f"dtype {out.dtype}")
    if meta_shape is not None and meta_shape != tuple(out.shape):
        raise SeedError("shape_mismatch", f"meta {meta_shape} vs cpu {tuple(out.shape)}")
    if not torch.equal(out, again) and not (out.is_floating_point() and torch.allclose(out, again, equal_nan=True,
                                                                                         rtol=0, atol=0)):
        raise SeedError("stochastic", "two forward passes on the same inputs differ")
    if out.is_floating_point() and not torch.isfinite(out).all():
        raise SeedError("non_finite", "output has NaN/inf on in-domain inputs")
    if out.numel() <= 1 and out.dim() > 0:
        raise SeedError("degenerate_output", f"output shape {tuple(out.shape)}")
    if meta_error:
        log.debug("seed %s: no meta run (%s)", seed.id, meta_error)
    return replace(seed, ops=ops, output_shape=tuple(out.shape), output_dtype=str(out.dtype).removeprefix("torch."),
                   meta_ok=meta_shape is not None)


# --------------------------------------------------------------------------------------------
# Crawling torch
# --------------------------------------------------------------------------------------------

# Namespaces in crawl order (earlier wins when two names give the same op label).
TORCH_NAMESPACES = (
    ("torch.nn", "nn", "nn_module"),
    ("torch", "torch.", "tensor_op"),
    ("torch.nn.functional", "F.", "functional"),
    ("torch.special", "torch.special.", "tensor_op"),
    ("torch.linalg", "torch.linalg.", "tensor_op"),
    ("torch.fft", "torch.fft.", "tensor_op"),
    ("torch.Tensor", "", "tensor_op"),
)
_RULE_INDEX: dict[str, tuple[str, Rule]] = {
    name: (family, rule) for family, table in FUNCTION_FAMILIES.items() for name, rule in table.items()
}
_MODULE_FAMILY = [
    (r"Loss", "loss"), (r"Conv|Pool|Pad|Fold|Unfold|Upsampl|Shuffle", "conv_pool"), (r"Norm|LRN", "norm"),
    (r"RNN|LSTM|GRU|Transformer|Attention", "sequence"), (r"Linear|Bilinear|Embedding|Distance|Similarity", "matmul"),
    (r"Flatten", "layout"), (r".", "activation"),
]


def _camel(name: str) -> str:
    return "".join(part[:1].upper() + part[1:] for part in name.strip("_").split("_") if part)


def _public_names(namespace: str) -> list[str]:
    import torch

    obj = importlib.import_module(namespace) if namespace != "torch.Tensor" else torch.Tensor
    names = []
    for name in sorted(dir(obj)):
        if namespace == "torch.Tensor":
            if name.startswith("__") and name.endswith("__") and name not in _DUNDERS:
                continue
        elif name.startswith("_"):
            continue
        try:
            value = getattr(obj, name)
        except Exception:  # noqa: BLE001
            continue
        if namespace == "torch.nn":
            if inspect.isclass(value) and issubclass(value, torch.nn.Module):
                names.append(name)
        elif callable(value) and not inspect.isclass(value) and not inspect.ismodule(value):
            names.append(name)
    return names


_DUNDERS = {"__add__", "__sub__", "__mul__", "__truediv__", "__floordiv__", "__mod__", "__pow__", "__matmul__",
            "__neg__", "__abs__", "__radd__", "__rsub__", "__rmul__", "__rtruediv__", "__rpow__", "__rmatmul__",
            "__iadd__", "__isub__", "__imul__", "__itruediv__", "__and__", "__or__", "__xor__", "__invert__",
            "__lt__", "__le__", "__gt__", "__ge__", "__eq__", "__ne__"}


def _candidates(namespace: str, prefix: str, kind: str) -> Iterable[tuple[str, Rule | None, str, str]]:
    """(qualified name, rule or None, family, skip reason) for every public name of a namespace."""
    import torch

    torch_names = set(dir(torch))
    for name in _public_names(namespace):
        qualified = f"{namespace}.{name}"
        excluded = exclusion(name)
        if excluded:
            yield qualified, None, "", f"{excluded[0]}:{excluded[1]}"
            continue
        if name in ALIASES:
            yield qualified, None, "", f"alias:same op as {ALIASES[name]}"
            continue
        if namespace == "torch.nn":
            rule = MODULES.get(name)
            family = next(fam for pattern, fam in _MODULE_FAMILY if re.search(pattern, name))
            yield qualified, rule, family, "" if rule else "no_rule:no module rule"
        elif namespace == "torch.Tensor":
            variants = [(key, rule) for key, rule in TENSOR_OPS.items() if key.split("#")[0] == name]
            if variants:
                for key, rule in variants:
                    yield qualified, rule, "operator", ""
            elif name in torch_names:
                yield qualified, None, "", f"duplicate_form:same op as torch.{name}"
            else:
                yield qualified, None, "", "no_rule:no tensor-method rule"
        elif name in _RULE_INDEX:
            family, rule = _RULE_INDEX[name]
            yield qualified, replace(rule, call=rule.call.replace("FN(", f"{prefix}{name}(")), family, ""
        else:
            yield qualified, None, "", "no_rule:no function rule"


def _seed_from_rule(qualified: str, kind: str, family: str, rule: Rule) -> Seed:
    short = qualified.rsplit(".", 1)[1]
    display = rule.name or (short if kind == "nn_module" else _camel(short))
    return Seed(qualified_name=qualified, kind=kind, call=rule.call, inputs=rule.inputs, accepts=rule.accepts,
                modules=rule.modules, out_domain=rule.out_domain, family=family, name=display, variant=rule.variant)


def _crawl(candidates: Iterable[tuple[str, str, str, Rule | None, str]], source: str) -> tuple[list[Seed], list[Skip]]:
    """Verify candidates in order; the first seed per (op label, variant) wins."""
    seeds, skips, seen = [], [], {}
    for qualified, kind, family, rule, reason in candidates:
        if rule is None:
            code, _, detail = reason.partition(":")
            skips.append(Skip(qualified, code, detail, source))
            continue
        seed = _seed_from_rule(qualified, kind, family, rule)
        try:
            label = (tuple(ops_from_code(seed_task(seed).code)), seed.variant)
        except Exception as e:  # noqa: BLE001
            skips.append(Skip(seed.id, "render_error", f"{type(e).__name__}: {e}", source))
            continue
        if label in seen:
            skips.append(Skip(seed.id, "duplicate_label", f"same op label {list(label[0])} as {seen[label]}", source))
            continue
        try:
            verified = verify(seed)
        except SeedError as e:
            skips.append(Skip(seed.id, e.reason, e.detail, source))
            continue
        seen[label] = seed.id
        seeds.append(verified)
    return seeds, skips


Crawled = tuple[tuple[Seed, ...], tuple[Skip, ...]]


def on_disk(name: str, crawl: Callable[[], Crawled], versions: dict[str, str]) -> Crawled:
    """A crawl's result from the cache folder (`<cache_root>/crawl/`), computed and stored when it is not
    there. A crawl runs every seed on the CPU: 10-15 s for torch and transformers together, paid by every
    dataset build (each device call of a resumed one, with the GPU idle) and by every test process that
    builds. The key is all it depends on: the crawling code (cudagym.synth's sources), Python and the
    crawled packages' versions. A cache that cannot be read or written costs a crawl, never a result."""
    from cudagym.eval.evaluate import cache_root

    key = hashlib.sha256()
    for path in sorted(Path(__file__).parent.glob("*.py")):
        key.update(path.name.encode() + b"\0" + path.read_bytes())
    key.update(repr(sorted({"python": sys.version, **versions}.items())).encode())
    path = cache_root() / "crawl" / f"{name}-{key.hexdigest()[:24]}.pkl"
    try:
        with open(path, "rb") as f:
            return pickle.load(f)
    except Exception:  # noqa: BLE001 - absent, partial or from an older class layout: crawl again
        pass
    result = crawl()
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_bytes(pickle.dumps(result))
        os.replace(tmp, path)  # atomic: concurrent builds read a whole file or none
    return result


def _package_version(name: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return "absent"


@functools.cache
def _crawl_torch_cached() -> Crawled:
    import torch

    return on_disk("torch", _crawl_torch_now, {"torch": torch.__version__})


def _crawl_torch_now() -> Crawled:
    def candidates():
        for namespace, prefix, kind in TORCH_NAMESPACES:
            for qualified, rule, family, reason in _candidates(namespace, prefix, kind):
                yield qualified, kind, family, rule, reason

    with single_threaded():
        seeds, skips = _crawl(candidates(), "torch")
    return tuple(seeds), tuple(skips)


def crawl_torch() -> tuple[list[Seed], list[Skip]]:
    """Seeds from torch.nn modules, torch.nn.functional and torch/Tensor ops (cached per process)."""
    seeds, skips = _crawl_torch_cached()
    return list(seeds), list(skips)


# --------------------------------------------------------------------------------------------
# Crawling transformers
# --------------------------------------------------------------------------------------------

# Model families whose building blocks are crawled (modeling module: transformers.models.<f>.modeling_<f>).
TRANSFORMERS_FAMILIES = (
    "llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "t5", "gpt2", "bert", "roberta", "clip", "vit",
    "siglip", "phi", "phi3", "falcon", "gpt_neox", "gptj", "olmo", "olmo2", "cohere", "starcoder2", "deepseek_v3",
    "granite", "stablelm", "persimmon", "codegen", "gpt_bigcode", "electra", "convnext", "dinov2", "opt", "bart",
    "whisper", "mixtral", "qwen2_moe", "mamba", "albert", "resnet", "deberta_v2",
)

# Small-config keyword values, used when the config class accepts the keyword. Dim symbols are
# substituted like every template (E: hidden size, J: FFN size, V: vocab, C: channels).
SMALL_CONFIG = {
    "hidden_size": "E", "intermediate_size": "J", "num_attention_heads": "4", "num_key_value_heads": "2",
    "head_dim": "E // 4", "num_hidden_layers": "1", "vocab_size": "V", "max_position_embeddings": "8 * S",
    "n_embd": "E", "n_head": "4", "n_inner": "J", "n_positions": "8 * S", "n_layer": "1", "d_model": "E", "d_ff": "J",
    "num_heads": "4", "d_kv": "E // 4", "ffn_dim": "J", "encoder_ffn_dim": "J", "decoder_ffn_dim": "J",
    "encoder_attention_heads": "4", "decoder_attention_heads": "4", "encoder_layers": "1", "decoder_layers": "1",
    "hidden_dropout_prob": "0.0", "attention_probs_dropout_prob": "0.0", "attention_dropout": "0.0", "dropout": "0.0",
    "dropout_rate": "0.0", "resid_pdrop": "0.0", "embd_pdrop": "0.0", "attn_pdrop": "0.0", "activation_dropout": "0.0",
    "hidden_dropout": "0.0", "layerdrop": "0.0", "drop_path_rate": "0.0", "image_size": "32", "patch_size": "8",
    "num_channels": "3", "n_routed_experts": "4", "num_local_experts": "4", "num_experts": "4",
    "num_experts_per_tok": "2", "moe_intermediate_size": "J", "q_lora_rank": "16", "kv_lora_rank": "16",
    "qk_rope_head_dim": "4", "qk_nope_head_dim": "4", "v_head_dim": "8", "ffn_hidden_size": "J",
    "hidden_sizes": "[C, 2 * C]", "depths": "[1, 1]", "embedding_size": "E", "state_size": "8", "expand": "2",
    "max_source_positions": "8 * S", "max_target_positions": "8 * S", "num_mel_bins": "8",
    "bos_token_id": "0", "eos_token_id": "1", "pad_token_id": "0",
}


@dataclass(frozen=True)
class Recipe:
    """How to build one role of transformers block. `CLS` stands for the class; the forward call is
    built from the block's forward signature (`_forward_call`)."""

    role: str
    pattern: str  # regex on the class name; the first matching recipe is used
    inits: tuple[str, ...]  # constructor templates, tried in order
    x: InputSpec = InputSpec("x", SEQ)


TRANSFORMERS_RECIPES = (
    Recipe("norm", r"(RMSNorm|LayerNorm)$", ("CLS(E)", "CLS(E, eps=1e-6)", "CLS(cfg)")),
    Recipe("patch_embedding", r"(PatchEmbeddings|VisionEmbeddings|^ViTEmbeddings|^Dinov2Embeddings)$", ("CLS(cfg)",),
           _x(("B", 3, 32, 32))),
    Recipe("embedding", r"(Embeddings|ScaledWordEmbedding)$", ("CLS(cfg)", "CLS(V, E, 0)"), _x(("B", "S"), "index", "V")),
    Recipe("mlp", r"(MLP|FFN|FeedForward|DenseActDense|DenseGatedActDense|LayerFF|Intermediate|SelfOutput|MoeBlock|MoE)$",
           ("CLS(cfg)", "CLS(J, cfg)")),
    Recipe("attention", r"Attention$", ("CLS(cfg, layer_idx=0)", "CLS(cfg)")),
    Recipe("conv_block", r"^(ResNet(Conv|Basic|BottleNeck)Layer|ConvNextLayer)$", ("CLS(C, O)", "CLS(cfg, C)"),
           _x(("B", "C", 16, 16))),
    Recipe("layer", r"(Layer|Block)$", ("CLS(cfg, layer_idx=0)", "CLS(cfg)")),
    Recipe("head", r"(Pooler|PredictionHeadTransform|LMPredictionHead|ClassificationHead)$", ("CLS(cfg)",)),
)
_SKIP_BLOCKS = re.compile(r"Cross|Flash|Sdpa|PreTrained|For[A-Z]|(Model|Stack|Encoder|Decoder|Wrapper)$")
_NONE_ARGS = {"attention_mask", "mask", "causal_attention_mask", "head_mask", "layer_head_mask", "position_bias",
              "position_ids", "cache", "past_key_value", "past_key_values", "encoder_hidden_states"}
_RESIDUAL_ARGS = {"input_tensor", "residual"}
_ROPE = "self.rotary(x, torch.arange(x.shape[1], device=x.device)[None])"


def _forward_call(cls, rotary: str | None) -> tuple[str, str]:
    """(`self.op(x, ...)` built from cls.forward's signature, "" ) or ("", reason it cannot be called)."""
    try:
        params = list(inspect.signature(cls.forward).parameters.values())[2:]  # self, the primary input
    except (TypeError, ValueError, IndexError):
        return "", "forward has no inspectable signature"
    args = ["x"]
    for p in params:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        if p.name == "position_embeddings":
            if rotary is None:
                return "", "needs rotary position embeddings and the family has no RotaryEmbedding"
            args.append(f"position_embeddings={_ROPE}")
        elif p.default is not p.empty:
            continue
        elif p.name in _NONE_ARGS:
            args.append(f"{p.name}=None")
        elif p.name in _RESIDUAL_ARGS:
            args.append(f"{p.name}=x")
        else:
            return "", f"forward needs {p.name!r}"
    return "self.op(" + ", ".join(args) + ")", ""


def _config_classes(module) -> dict[str, type]:
    from transformers import PretrainedConfig

    return {n: c for n, c in vars(module).items()
            if inspect.isclass(c) and issubclass(c, PretrainedConfig) and c is not PretrainedConfig}


def _config_for(configs: dict[str, type], block: str):
    """The config class a block is built from: a VisionConfig for vision blocks, else the text/main config."""
    def rank(name: str) -> tuple:
        vision = "VisionConfig" in name
        return (vision != ("Vision" in block or "Patch" in block), "TextConfig" not in name, len(name))

    return configs[min(configs, key=rank)] if configs else None


@functools.cache
def _config_expr(config_cls) -> str:
    """`<Config>(hidden_size=E, ...)` with the SMALL_CONFIG keywords the class takes."""
    try:
        params = inspect.signature(config_cls.__init__).parameters
    except (TypeError, ValueError):
        params = {}
    known = set(params)
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        try:
            known |= set(vars(config_cls()))
        except Exception:  # noqa: BLE001
            pass
    args = ", ".join(f"{k}={v}" for k, v in SMALL_CONFIG.items() if k in known)
    return f"{config_cls.__name__}({args})"


def _impl_key(obj, _memo: dict = {}, _active: set = set()) -> str:  # noqa: B006 - process-wide memo
    """A digest of the bytecode of a class's methods (over its transformers MRO) or of a function.
    Names of classes/functions of the same module that the code uses contribute their own digest,
    so `MistralRMSNorm` (a "# Copied from" of LlamaRMSNorm) gets Llama's key while GemmaDecoderLayer,
    whose code equals Llama's but builds a different RMSNorm, does not. Cheaper than reading source."""
    if obj in _memo:
        return _memo[obj]
    if obj in _active:  # self-reference
        return getattr(obj, "__qualname__", "?")
    _active.add(obj)
    try:
        module = sys.modules.get(obj.__module__)
        functions = []
        if inspect.isclass(obj):
            for klass in obj.__mro__:
                if klass.__module__.startswith("transformers"):
                    functions += [(name, getattr(m, "__func__", m)) for name, m in sorted(vars(klass).items())]
        else:
            functions = [("", obj)]
        parts = [(name, _code_key(f.__code__, f.__doc__, module)) for name, f in functions if hasattr(f, "__code__")]
        _memo[obj] = hashlib.sha256(repr(parts).encode()).hexdigest()[:16]
        return _memo[obj]
    finally:
        _active.discard(obj)


def _code_key(code, doc, module) -> tuple:
    consts = tuple(_code_key(c, None, module) if inspect.iscode(c) else c for c in code.co_consts
                   if not (doc and c == doc))
    names = []
    for name in code.co_names:
        target = getattr(module, name, None)
        local = (inspect.isclass(target) or inspect.isfunction(target)) and target.__module__ == module.__name__
        names.append(_impl_key(target) if local else name)
    return code.co_code, tuple(names), consts


def _family_prefix(classes: Iterable[str], name: str) -> str:
    """The model prefix of a class name ("Llama" for "LlamaAttention"), taken from its RotaryEmbedding."""
    for other in classes:
        if other.endswith("RotaryEmbedding") and name.startswith(other[: -len("RotaryEmbedding")]):
            return other[: -len("RotaryEmbedding")]
    return ""


def _block_seeds(modname: str, name: str, cls, classes: dict, configs: dict) -> tuple[list[Seed], str]:
    """Candidate seeds for one block class (one per constructor recipe), or ([], reason)."""
    recipe = next((r for r in TRANSFORMERS_RECIPES if re.search(r.pattern, name)), None)
    if recipe is None:
        return [], "no_recipe:no recipe for this kind of block"
    prefix = _family_prefix(classes, name)
    rotary = f"{prefix}RotaryEmbedding" if prefix and f"{prefix}RotaryEmbedding" in classes else None
    call, why = _forward_call(cls, rotary)
    if not call:
        return [], f"unsupported_forward:{why}"
    first = next(iter(list(inspect.signature(cls.forward).parameters)[1:2]), "")
    x = {"input_ids": InputSpec("x", ("B", "S"), "index", "V"),
         "pixel_values": InputSpec("x", ("B", 3, 32, 32))}.get(first, recipe.x)
    config_cls = _config_for(configs, name)
    seeds = []
    for init in recipe.inits:
        slots = [("op", init.replace("CLS", name))] + ([("rotary", f"{rotary}(cfg)")] if "self.rotary" in call else [])
        uses_cfg = any("cfg" in template for _, template in slots)
        if uses_cfg and config_cls is None:
            continue
        imports = [f"from {modname} import {name}"] + ([f"from {modname} import {rotary}"] if len(slots) > 1 else [])
        if uses_cfg:
            imports.append(f"from {config_cls.__module__} import {config_cls.__name__}")
        seeds.append(Seed(f"{modname}.{name}", "transformers_block", call, (x,), accepts=_accepts_for(x),
                          modules=tuple(slots), config=_config_expr(config_cls) if uses_cfg else "",
                          imports=tuple(imports), family=recipe.role, name=name))
    return seeds, "" if seeds else "no_recipe:no config class for a config-built block"


def _accepts_for(x: InputSpec) -> tuple:
    if x.domain == "index":
        return ()
    if x.shape == SEQ:
        return ("_", "_", "E")
    return ("_",) * len(x.shape)


def _transformers_candidates() -> Iterable[tuple[str, list[Seed], str]]:
    """(qualified name, candidate seeds tried in order, skip reason or source key)."""
    import torch
    from transformers import activations

    act_args = {"ClippedGELUActivation": "-10.0, 10.0", "XIELUActivation": "dtype=torch.float32"}
    for name, cls in sorted(vars(activations).items()):
        if inspect.isclass(cls) and issubclass(cls, torch.nn.Module) and cls.__module__ == activations.__name__:
            seed = Seed(f"transformers.activations.{name}", "transformers_block", "self.op(x)", (_x(P4),), accepts=ANY,
                        modules=(("op", f"{name}({act_args.get(name, '')})"),),
                        imports=(f"from transformers.activations import {name}",), family="activation", name=name)
            yield seed.qualified_name, [seed], _impl_key(cls)
    for family in TRANSFORMERS_FAMILIES:
        modname = f"transformers.models.{family}.modeling_{family}"
        try:
            module = importlib.import_module(modname)
        except Exception as e:  # noqa: BLE001
            yield modname, [], f"import_error:{type(e).__name__}: {str(e)[:120]}"
            continue
        configs = _config_classes(module)
        classes = {n: c for n, c in vars(module).items()
                   if inspect.isclass(c) and issubclass(c, torch.nn.Module) and c.__module__ == modname}
        for name in sorted(classes):
            if _SKIP_BLOCKS.search(name):
                continue
            seeds, reason = _block_seeds(modname, name, classes[name], classes, configs)
            yield f"{modname}.{name}", seeds, reason or _impl_key(classes[name])


@functools.cache
def _crawl_transformers_cached() -> Crawled:
    import torch

    return on_disk("transformers", _crawl_transformers_now,
                   {"torch": torch.__version__, "transformers": _package_version("transformers")})


def _crawl_transformers_now() -> Crawled:
    try:
        import transformers
    except Exception as e:  # noqa: BLE001 - optional dependency
        return (), (Skip("transformers", "import_error", f"{type(e).__name__}: {e}", "transformers"),)
    seeds: list[Seed] = []
    skips: list[Skip] = []
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    try:
        with single_threaded():
            _verify_transformers(_transformers_candidates(), seeds, skips)
    finally:
        transformers.logging.set_verbosity(verbosity)
    log.info("transformers %s: %d seeds, %d skips", transformers.__version__, len(seeds), len(skips))
    return tuple(seeds), tuple(skips)


def _verify_transformers(items, seeds: list[Seed], skips: list[Skip]) -> None:
    """The first candidate per class that verifies becomes its seed; copied implementations are skipped."""
    seen: dict[str, str] = {}  # implementation key -> first class with that implementation
    for qualified, candidates, key in items:
        if not candidates:
            code, _, detail = key.partition(":")
            skips.append(Skip(qualified, code, detail, "transformers"))
            continue
        if key in seen:
            skips.append(Skip(qualified, "duplicate_impl", f"same implementation as {seen[key]}", "transformers"))
            continue
        errors: list[str] = []
        for seed in [c for seed in candidates for c in (seed, replace(seed, call=seed.call + "[0]"))]:
            if seed.call.endswith("[0]") and not any(e.startswith("non_tensor_output") for e in errors):
                continue  # index the output only when the block returned a tuple
            try:
                verified = verify(seed)
            except SeedError as e:
                errors.append(f"{e.reason}: {e.detail}")
                continue
            seen[key] = qualified
            seeds.append(verified)
            break
        else:
            reasons = {e.split(":")[0] for e in errors}
            reason = next(iter(reasons)) if len(reasons) == 1 else "failed_recipes"
            skips.append(Skip(qualified, reason, " | ".join(errors)[:400], "transformers"))


def crawl_transformers() -> tuple[list[Seed], list[Skip]]:
    """Seeds from transformers (activations and model building blocks built from small configs).
    If transformers is not importable: no seeds and one Skip saying why (cached per process)."""
    seeds, skips = _crawl_transformers_cached()
    return list(seeds), list(skips)
