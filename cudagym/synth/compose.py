"""Stage 2 of synth: compose up to five seeds into one fused KernelBench-format task.

A composer (`Composer`: `compose(seeds, k, rng) -> Task | Reject`) is registered by name in
`COMPOSERS`. The `programmatic` composer needs no LLM: it grows a chain of K seeds where each
seed's primary input is the previous seed's output. Shapes connect by *binding*: the next seed's
shape pattern (`Seed.accepts`, e.g. `("B", "C", "_", "_")` for Conv2d) is matched against the
incoming shape, which fixes its symbolic dims (Conv2d's in_channels becomes the previous
out_channels); where x has more dims than the next seed takes, a view is inserted (`x.flatten(k)`;
`x.unsqueeze(-1)` for the opposite case is opt-in). Each candidate step is run on meta tensors to
learn its output shape (CPU for the few seeds without meta kernels); the finished chain is run once
more and its AST labels checked against its seeds. Seeds are drawn with equal weight per seed
family (`ComposeConfig.family_weights`), so the 70 pointwise seeds do not crowd out the convs. The
fused `Model` is written with libcst: seed templates are parsed once and their placeholders
(inputs, dims, module slots) substituted by a CST transformer.

K, the number of composed seeds, follows `ComposeConfig.k_distribution`. Default
(`PAPER_K_DISTRIBUTION`), an assumption: CUDA-Agent-Ops-6K (CUDA Agent paper, arXiv 2602.24286)
composes "up to 5" torch operators and 83.77% of its tasks have K=2; the paper gives no split of
the remaining 16.23%, so we spread it over K=3..5 halving at each step (9.27%, 4.64%, 2.32%) and
give K=1 no mass (single ops are KernelBench level 1 territory).

Labels for the dataset row come from the code's AST only: `ops_from_code` and `data_source_of`.
"""

from __future__ import annotations

import ast
import functools
import importlib
import logging
import math
import random
import re
from collections import Counter, deque
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Callable, Iterable, Iterator, Mapping, Protocol, Sequence

import libcst as cst

from cudagym.synth.crawl import (
    DIMS,
    DOMAIN_ACCEPTS,
    DOMAINS,
    LIKE_X,
    InputSpec,
    Seed,
    SeedError,
    infer_output,
    single_threaded,
)
from cudagym.tasks import Task, sha256_text

if TYPE_CHECKING:
    from cudagym.synth.llm import LLMConfig

log = logging.getLogger(__name__)

PAPER_K_DISTRIBUTION: Mapping[int, float] = {1: 0.0, 2: 0.8377, 3: 0.0927, 4: 0.0464, 5: 0.0232}
BASE_IMPORTS = ("import torch", "import torch.nn as nn", "import torch.nn.functional as F")

# --------------------------------------------------------------------------------------------
# Labels from the AST
# --------------------------------------------------------------------------------------------

BINOP_LABELS = {ast.Add: "add", ast.Sub: "sub", ast.Mult: "mul", ast.Div: "div", ast.FloorDiv: "floor_divide",
                ast.Mod: "remainder", ast.Pow: "pow", ast.MatMult: "matmul", ast.BitAnd: "bitwise_and",
                ast.BitOr: "bitwise_or", ast.BitXor: "bitwise_xor", ast.LShift: "bitwise_left_shift",
                ast.RShift: "bitwise_right_shift"}
UNARY_LABELS = {ast.USub: "neg", ast.Invert: "bitwise_not"}
COMPARE_LABELS = {ast.Gt: "gt", ast.GtE: "ge", ast.Lt: "lt", ast.LtE: "le", ast.Eq: "eq", ast.NotEq: "ne"}
# Tensor methods that only reinterpret or inspect a tensor (views, casts, sizes): not operators.
# The composer's glue uses only these, so glue never shows up in `ops`.
NON_OP_METHODS = frozenset({
    "view", "view_as", "reshape", "reshape_as", "flatten", "unsqueeze", "squeeze", "contiguous", "size", "dim",
    "numel", "item", "tolist", "to", "float", "double", "half", "bfloat16", "int", "long", "bool", "type",
    "type_as", "cpu", "cuda", "detach", "requires_grad_", "register_buffer", "register_parameter",
})
_LABELLED_ROOTS = ("torch", "transformers")


def ops_from_code(code: str) -> list[str]:
    """Operator labels of a task, in evaluation order, from its AST (never from strings/comments).

    Labels: the class name of each module built in `Model.__init__` and called in `forward`
    (`Conv2d`, `LlamaMLP`; a called `nn.Sequential` gives its members), the last name of every
    torch/transformers function called (`torch.sum` -> `sum`, `F.gelu` -> `gelu`), tensor methods
    (`x.cumsum(1)` -> `cumsum`, except view/cast/size methods, `NON_OP_METHODS`), and Python
    operators on tensors (`+` -> `add`, `@` -> `matmul`, `-x` -> `neg`, `<` -> `lt`).
    Helper methods of Model called from forward are followed.
    """
    tree = ast.parse(code)
    aliases = _import_aliases(tree)
    model = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Model"), None)
    if model is None:
        model = next((n for n in tree.body if isinstance(n, ast.ClassDef)), None)
    if model is None:
        return []
    methods = {n.name: n for n in model.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    modules = _module_slots(methods.get("__init__"), aliases)
    labeller = _Labeller(aliases, modules, methods)
    forward = methods.get("forward")
    if forward is None:
        return []
    for stmt in forward.body:
        labeller.walk(stmt)
    return labeller.labels


def data_source_of(code: str) -> str:
    """`transformers` if the task imports transformers, else `torch#K` with K = len(ops_from_code)."""
    tree = ast.parse(code)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "transformers" for a in node.names):
            return "transformers"
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "transformers":
            return "transformers"
    return f"torch#{len(ops_from_code(code))}"


def _import_aliases(tree: ast.Module) -> dict[str, str]:
    """Local name -> qualified name, from the module's imports."""
    aliases: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.asname:
                    aliases[a.asname] = a.name
                else:
                    aliases[a.name.split(".")[0]] = a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module:
            for a in node.names:
                aliases[a.asname or a.name] = f"{node.module}.{a.name}"
    return aliases


def _qualified(node: ast.AST, aliases: Mapping[str, str]) -> str | None:
    """`F.gelu` -> `torch.nn.functional.gelu` when the root name is an import alias."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name) and node.id in aliases:
        return ".".join([aliases[node.id], *reversed(parts)])
    return None


def _module_slots(init: ast.FunctionDef | None, aliases: Mapping[str, str]) -> dict[str, list[str]]:
    """`self.<attr> = <Module>(...)` in __init__ -> {attr: [labels]}."""
    slots: dict[str, list[str]] = {}
    if init is None:
        return slots
    for node in ast.walk(init):
        if not isinstance(node, ast.Assign):
            continue
        for target in node.targets:
            if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self":
                labels = _constructor_labels(node.value, aliases)
                if labels is not None:
                    slots[target.attr] = labels
    return slots


def _constructor_labels(value: ast.AST, aliases: Mapping[str, str]) -> list[str] | None:
    if isinstance(value, ast.Call):
        qualified = _qualified(value.func, aliases)
        if qualified is None or not qualified.startswith(_LABELLED_ROOTS):
            return None
        name = qualified.rsplit(".", 1)[-1]
        if name in ("Sequential", "ModuleList"):
            return [label for arg in value.args for label in (_constructor_labels(arg, aliases) or [])]
        if name in ("Parameter", "Buffer") or not name[:1].isupper():
            return None
        return [name]
    qualified = _qualified(value, aliases)  # self.act = torch.relu
    if qualified and qualified.startswith(_LABELLED_ROOTS):
        return [qualified.rsplit(".", 1)[-1]]
    return None


def _is_scalar_expr(node: ast.AST) -> bool:
    """Python-number arithmetic (constants, sizes, math.*) is not a tensor operator."""
    if isinstance(node, ast.Constant):
        return True
    if isinstance(node, ast.UnaryOp):
        return _is_scalar_expr(node.operand)
    if isinstance(node, ast.BinOp):
        return _is_scalar_expr(node.left) and _is_scalar_expr(node.right)
    if isinstance(node, ast.Subscript):
        return isinstance(node.value, ast.Attribute) and node.value.attr == "shape"
    if isinstance(node, ast.Attribute):
        return node.attr in ("shape", "ndim")
    if isinstance(node, ast.Call):
        func = node.func
        if isinstance(func, ast.Name) and func.id in ("len", "int", "float", "round", "abs", "min", "max"):
            return all(_is_scalar_expr(a) for a in node.args) or func.id == "len"
        if isinstance(func, ast.Attribute) and func.attr in ("size", "dim", "numel"):
            return True
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "math":
            return True
    return False


class _Labeller:
    def __init__(self, aliases, modules, methods):
        self.aliases, self.modules, self.methods = aliases, modules, methods
        self.labels: list[str] = []
        self._stack: list[str] = []

    def walk(self, node: ast.AST) -> None:
        """Post-order: operands before the operator (evaluation order)."""
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            return
        for child in ast.iter_child_nodes(node):
            self.walk(child)
        self.labels.extend(self._label(node))

    def _label(self, node: ast.AST) -> list[str]:
        if isinstance(node, ast.BinOp) and type(node.op) in BINOP_LABELS:
            return [] if _is_scalar_expr(node.left) and _is_scalar_expr(node.right) else [BINOP_LABELS[type(node.op)]]
        if isinstance(node, ast.AugAssign) and type(node.op) in BINOP_LABELS:
            return [] if _is_scalar_expr(node.value) and _is_scalar_expr(node.target) else [BINOP_LABELS[type(node.op)]]
        if isinstance(node, ast.UnaryOp) and type(node.op) in UNARY_LABELS:
            return [] if _is_scalar_expr(node.operand) else [UNARY_LABELS[type(node.op)]]
        if isinstance(node, ast.Compare):
            if _is_scalar_expr(node.left) and all(_is_scalar_expr(c) for c in node.comparators):
                return []
            return [COMPARE_LABELS[type(op)] for op in node.ops if type(op) in COMPARE_LABELS]
        if isinstance(node, ast.Call):
            return self._call(node)
        return []

    def _call(self, node: ast.Call) -> list[str]:
        func = node.func
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "self":
            if func.attr in self.modules:
                return list(self.modules[func.attr])
            if func.attr in self.methods and func.attr not in self._stack and func.attr not in ("__init__", "forward"):
                self._stack.append(func.attr)  # follow helper methods, once per call chain
                for stmt in self.methods[func.attr].body:
                    self.walk(stmt)
                self._stack.pop()
            return []
        qualified = _qualified(func, self.aliases)
        if qualified is not None:
            if not qualified.startswith(_LABELLED_ROOTS):
                return []
            name = qualified.rsplit(".", 1)[-1]
            return [] if name in ("Parameter", "no_grad", "device", "Size") else [name]
        if isinstance(func, ast.Attribute):  # a method on a tensor expression
            if _is_scalar_expr(func.value) or func.attr in NON_OP_METHODS:
                return []
            return [func.attr]
        return []


# --------------------------------------------------------------------------------------------
# Binding shapes and planning steps
# --------------------------------------------------------------------------------------------

Dim = tuple  # (size: int, code: str | None) - code is an identifier/expression, None for a literal


class Idents:
    """Module-level constant names of one task: `in_channels`, `in_channels_2`, ... -> size."""

    def __init__(self, values: Mapping[str, int] | None = None):
        self.values: dict[str, int] = dict(values or {})

    def name(self, symbol: str, value: int) -> str:
        base = DIMS[symbol][0]
        candidate, n = base, 2
        while candidate in self.values and self.values[candidate] != value:
            candidate, n = f"{base}_{n}", n + 1
        self.values[candidate] = value
        return candidate

    def copy(self) -> "Idents":
        return Idents(self.values)


@dataclass(frozen=True)
class Step:
    """One seed placed in a chain: its bound dims, the shape x has when it arrives, and the view
    (`glue`, a Tensor method call such as `flatten(1)`) applied to x first."""

    seed: Seed
    dims: tuple  # ((symbol, Dim), ...)
    x_shape: tuple  # (Dim, ...)
    glue: str = ""

    @property
    def dim_map(self) -> dict[str, Dim]:
        return dict(self.dims)


@functools.lru_cache(maxsize=None)
def _parse(template: str) -> cst.BaseExpression:
    return cst.parse_expression(template)


@functools.lru_cache(maxsize=None)
def _template_symbols(template: str) -> tuple[str, ...]:
    names = [n.id for n in ast.walk(ast.parse(template, mode="eval")) if isinstance(n, ast.Name)]
    return tuple(dict.fromkeys(n for n in names if n in DIMS))


def seed_symbols(seed: Seed) -> tuple[str, ...]:
    """Dim symbols a seed uses, in order: constructor/config templates, call, then input shapes."""
    found: list[str] = []
    for template in [t for _, t in seed.modules] + ([seed.config] if seed.config else []) + [seed.call]:
        found.extend(_template_symbols(template))
    for spec in seed.inputs:
        for el in ([] if spec.shape == LIKE_X else spec.shape):
            if isinstance(el, str) and el not in ("_", "..."):
                found.extend(_template_symbols(el))
        if isinstance(spec.high, str):
            found.append(spec.high)
    return tuple(dict.fromkeys(found))


def _align(pattern: Sequence, shape: Sequence[Dim]) -> list | None:
    """The pattern element each dim of `shape` falls under ("..." dims get None); None if ranks differ."""
    if "..." in pattern:
        i = pattern.index("...")
        head, tail = list(pattern[:i]), list(pattern[i + 1:])
        if len(shape) < len(head) + len(tail):
            return None
        return head + [None] * (len(shape) - len(head) - len(tail)) + tail
    return list(pattern) if len(shape) == len(pattern) else None


def bind(pattern: Sequence, shape: Sequence[Dim]) -> dict[str, Dim] | None:
    """Match a shape pattern against a concrete shape; the symbol -> Dim binding, or None."""
    aligned = _align(pattern, shape)
    if aligned is None:
        return None
    bound: dict[str, Dim] = {}
    for p, d in zip(aligned, shape):
        if p is None or p == "_":
            continue
        if isinstance(p, int):
            if d[0] != p:
                return None
        elif p in bound:
            if bound[p][0] != d[0]:
                return None
        else:
            bound[p] = d
    return bound


def _rank_range(pattern: Sequence) -> tuple[int, int | None]:
    n = len(pattern) - (1 if "..." in pattern else 0)
    return n, (None if "..." in pattern else n)


def glue_for(pattern: Sequence, shape: tuple, unsqueeze: bool = False) -> tuple[str, tuple] | None:
    """The cheap view that gives x a rank the pattern accepts: ("", shape) when none is needed,
    None when there is none (x.flatten(k) drops rank; x.unsqueeze(-1) adds it if allowed)."""
    lo, hi = _rank_range(pattern)
    rank = len(shape)
    if hi is not None and rank > hi:
        if hi == 0:
            return None
        rest = shape[hi - 1:]
        return f"flatten({hi - 1})", tuple(shape[: hi - 1]) + ((math.prod(v for v, _ in rest), None),)
    if rank < lo:
        if not unsqueeze:
            return None
        return ".".join(["unsqueeze(-1)"] * (lo - rank)), tuple(shape) + ((1, None),) * (lo - rank)
    return "", tuple(shape)


def _resolve(seed: Seed, bound: Mapping[str, Dim], idents: Idents, scale: int) -> dict[str, Dim]:
    dims: dict[str, Dim] = {}
    for symbol, (value, code) in bound.items():
        dims[symbol] = (value, code if code and code.isidentifier() else idents.name(symbol, value))
    for symbol in seed_symbols(seed):
        if symbol not in dims:
            value = DIMS[symbol][1] * scale
            dims[symbol] = (value, idents.name(symbol, value))
    return dims


def _eval_dim(expr: str, dims: Mapping[str, Dim]) -> Dim:
    value = eval(compile(expr, "<dim>", "eval"), {"__builtins__": {}}, {s: v for s, (v, _) in dims.items()})  # noqa: S307
    code = re.sub(r"\b[A-Z]\b", lambda m: dims[m.group(0)][1], expr)
    return int(value), code.replace("*", " * ")


def shape_of(spec_shape: tuple, dims: Mapping[str, Dim], x_shape: tuple) -> tuple:
    if spec_shape == LIKE_X:
        return tuple(x_shape)
    out = []
    for el in spec_shape:
        if isinstance(el, int):
            out.append((el, None))
        elif el in dims:
            out.append(dims[el])
        else:
            out.append(_eval_dim(el, dims))
    return tuple(out)


def first_step(seed: Seed, idents: Idents, scale: int = 1) -> Step:
    dims = _resolve(seed, {}, idents, scale)
    return Step(seed, tuple(dims.items()), shape_of(seed.primary.shape, dims, ()))


def next_step(seed: Seed, x_shape: tuple, idents: Idents, scale: int = 1, allow_glue: bool = True,
              allow_unsqueeze: bool = False) -> Step | None:
    """Place `seed` after a step whose output has `x_shape`; None when the shapes cannot connect."""
    glued = glue_for(seed.pattern, x_shape, allow_unsqueeze) if allow_glue else ("", tuple(x_shape))
    if glued is None:
        return None
    glue, shape = glued
    bound = bind(seed.pattern, shape)
    if bound is None:
        return None
    dims = _resolve(seed, bound, idents, scale)
    # literal dims of x take the names of the symbols they were bound to
    shape = tuple(dims[p] if isinstance(p, str) and p in dims else d for p, d in zip(_align(seed.pattern, shape), shape))
    return Step(seed, tuple(dims.items()), shape, glue)


def name_output(step: Step, out_shape: Sequence[int]) -> tuple:
    """Dims of a step's output: reuse the names of x's dims and the seed's dims where sizes match."""
    xs = step.x_shape
    if tuple(v for v, _ in xs) == tuple(out_shape):
        return xs
    pool = [d for _, d in step.dims] + [d for d in xs if d[1]]
    named = []
    for i, value in enumerate(out_shape):
        if i < len(xs) and xs[i][0] == value and xs[i][1]:
            named.append(xs[i])
        else:
            named.append(next((d for d in pool if d[0] == value), (value, None)))
    return tuple(named)


# --------------------------------------------------------------------------------------------
# Rendering with libcst
# --------------------------------------------------------------------------------------------


class _Substitute(cst.CSTTransformer):
    """Replace placeholder names (inputs, dims, `cfg`) and module slots (`self.op`) in a template.
    Attribute names and keyword-argument names are never replaced."""

    def __init__(self, names: Mapping[str, cst.BaseExpression], slots: Mapping[str, str]):
        super().__init__()
        self.names, self.slots = names, slots
        self._protected: set[int] = set()

    def visit_Attribute(self, node: cst.Attribute) -> bool:
        self._protected.add(id(node.attr))
        return True

    def visit_Arg(self, node: cst.Arg) -> bool:
        if node.keyword is not None:
            self._protected.add(id(node.keyword))
        return True

    def visit_Param(self, node: cst.Param) -> bool:
        self._protected.add(id(node.name))
        return True

    def leave_Name(self, original: cst.Name, updated: cst.Name) -> cst.BaseExpression:
        if id(original) in self._protected:
            return updated
        return self.names.get(original.value, updated)

    def leave_Attribute(self, original: cst.Attribute, updated: cst.Attribute) -> cst.BaseExpression:
        if isinstance(original.value, cst.Name) and original.value.value == "self" and original.attr.value in self.slots:
            return updated.with_changes(value=cst.Name("self"), attr=cst.Name(self.slots[original.attr.value]))
        return updated


def _substitute(template: str, names: Mapping[str, cst.BaseExpression],
                slots: Mapping[str, str] | None = None) -> cst.BaseExpression:
    return _parse(template).visit(_Substitute(names, slots or {}))


def _snake(name: str) -> str:
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).lower()


def _slot_base(template: str) -> str:
    func = _parse(template)
    while isinstance(func, cst.Call):
        func = func.func
    name = func.attr.value if isinstance(func, cst.Attribute) else getattr(func, "value", "op")
    return _snake(name)


def _unique(base: str, taken: set[str]) -> str:
    name, n = base, 2
    while name in taken:
        name, n = f"{base}_{n}", n + 1
    taken.add(name)
    return name


def _domain_expr(spec: InputSpec, shape: tuple, dims: Mapping[str, Dim]) -> str:
    shape_code = ", ".join(code or str(value) for value, code in shape)
    high = spec.high
    high_code = dims[high][1] if isinstance(high, str) else str(high)
    tuple_code = f"({shape_code},)" if len(shape) == 1 else f"({shape_code})"
    return DOMAINS[spec.domain].replace("SHAPE", shape_code).replace("TUPLE", tuple_code).replace("HIGH", high_code)


def _line(node: cst.BaseSmallStatement) -> cst.SimpleStatementLine:
    return cst.SimpleStatementLine(body=[node])


def _assign(target: str, value: cst.BaseExpression) -> cst.SimpleStatementLine:
    return _line(cst.Assign(targets=[cst.AssignTarget(target=_parse(target))], value=value))


def _function(name: str, params: Sequence[str], body: Sequence[cst.BaseStatement], blank_lines: int) -> cst.FunctionDef:
    return cst.FunctionDef(
        name=cst.Name(name),
        params=cst.Parameters(params=[cst.Param(cst.Name(p)) for p in params]),
        body=cst.IndentedBlock(body=list(body)),
        leading_lines=[cst.EmptyLine(indent=False)] * blank_lines,
    )


_SUPER_INIT = cst.parse_statement("super().__init__()")


@functools.lru_cache(maxsize=None)
def _parse_statement(source: str) -> cst.BaseStatement:
    return cst.parse_statement(source)


def _identifiers(code: str) -> list[str]:
    return re.findall(r"[A-Za-z_][A-Za-z0-9_]*", code)


def _template_idents(template: str, dims: Mapping[str, Dim]) -> list[str]:
    """Identifiers the dims of a template render to (e.g. `in_channels` for `C`)."""
    return [n for symbol in _template_symbols(template) if symbol in dims for n in _identifiers(dims[symbol][1])]


def render_steps(steps: Sequence[Step], idents: Idents, doc: str = "") -> str:
    """KernelBench-format source for a chain of steps (the first step's x comes from get_inputs)."""
    taken_attrs: set[str] = set()
    taken_vars: set[str] = {"x", "self"}
    init_body: list[cst.BaseStatement] = [_SUPER_INIT]
    init_idents: list[str] = []
    forward_idents: list[str] = []
    forward_body: list[cst.BaseStatement] = []
    forward_params = ["self", "x"]
    input_exprs = [_domain_expr(steps[0].seed.primary, steps[0].x_shape, steps[0].dim_map)]
    imports = list(BASE_IMPORTS)
    for step in steps:
        seed, dims = step.seed, step.dim_map
        imports.extend(i for i in seed.imports if i not in imports)
        names: dict[str, cst.BaseExpression] = {s: _parse(code) for s, (_, code) in dims.items()}
        names["x"] = cst.Name("x")
        cfg_at = len(init_idents)
        if seed.config:
            cfg = _unique("cfg", taken_vars)
            names["cfg"] = cst.Name(cfg)
            init_body.append(_assign(cfg, _substitute(seed.config, names)))
        slots = {slot: _unique(_slot_base(template), taken_attrs) for slot, template in seed.modules}
        for spec in seed.inputs[1:]:
            shape = shape_of(spec.shape, dims, step.x_shape)
            if spec.param:
                attr = _unique(spec.name, taken_attrs)
                names[spec.name] = _parse(f"self.{attr}")
                expr = f"nn.Parameter({_domain_expr(spec, shape, dims)})"
                init_idents.extend(_identifiers(expr))
                init_body.append(_assign(f"self.{attr}", _parse(expr)))
            else:
                var = _unique(spec.name, taken_vars)
                names[spec.name] = cst.Name(var)
                forward_params.append(var)
                input_exprs.append(_domain_expr(spec, shape, dims))
        for slot, template in seed.modules:
            init_idents.extend(_template_idents(template, dims))
            init_body.append(_assign(f"self.{slots[slot]}", _substitute(template, names, slots)))
        if seed.config:
            init_idents[cfg_at:cfg_at] = _template_idents(seed.config, dims)
        if step.glue:
            forward_body.append(_assign("x", _parse(f"x.{step.glue}")))
        forward_idents.extend(_template_idents(seed.call, dims))
        forward_body.append(_assign("x", _substitute(seed.call, names, slots)))
    forward_body.append(_line(cst.Return(value=cst.Name("x"))))

    input_idents = [n for e in input_exprs for n in _identifiers(e)]
    init_params = [n for n in dict.fromkeys(init_idents) if n in idents.values]
    used = set(init_idents) | set(forward_idents) | set(input_idents)
    constants = [n for n in dict.fromkeys(input_idents + list(idents.values)) if n in idents.values and n in used]

    class_body: list[cst.BaseStatement] = []
    if doc:
        class_body.append(_line(cst.Expr(cst.SimpleString(f'"""{doc}"""'))))
    class_body.append(_function("__init__", ["self", *init_params], init_body, 1 if doc else 0))
    class_body.append(_function("forward", forward_params, forward_body, 1))
    model = cst.ClassDef(name=cst.Name("Model"), bases=[cst.Arg(value=cst.parse_expression("nn.Module"))],
                         body=cst.IndentedBlock(body=class_body), leading_lines=[cst.EmptyLine(indent=False)] * 2)
    consts = [_assign(n, cst.Integer(str(idents.values[n]))) for n in constants]
    if consts:
        consts[0] = consts[0].with_changes(leading_lines=[cst.EmptyLine(indent=False)] * 2)
    get_inputs = _function("get_inputs", [], [_line(cst.Return(value=cst.List(
        [cst.Element(_parse(e)) for e in input_exprs])))], 2)
    get_init_inputs = _function("get_init_inputs", [], [_line(cst.Return(value=cst.List(
        [cst.Element(cst.Name(n)) for n in init_params])))], 2)
    header = [_parse_statement(i) for i in imports]
    return cst.Module(body=[*header, model, *consts, get_inputs, get_init_inputs]).code


def seed_task(seed: Seed, scale: int = 1) -> Task:
    """The KernelBench task of a single seed (see Seed.to_task)."""
    task = _seed_task(seed, scale)
    return replace(task, provenance=dict(task.provenance))


@functools.lru_cache(maxsize=4096)
def _seed_task(seed: Seed, scale: int) -> Task:  # seeds are immutable: render each once
    idents = Idents()
    step = first_step(seed, idents, scale)
    code = render_steps([step], idents, doc=f"{seed.name}: {seed.qualified_name}")
    provenance = {"seed_id": seed.id, "kind": seed.kind, "family": seed.family, "scale": scale}
    return Task(id=f"seed/{seed.id}", name=seed.name, code=code, level=1, source="synth:seed", provenance=provenance)


def seed_snippet(seed: Seed) -> str:
    """A seed's constructor call(s) (or forward call) with dims at their scale-1 sizes."""
    names: dict[str, cst.BaseExpression] = {s: cst.Integer(str(DIMS[s][1])) for s in seed_symbols(seed)}
    if seed.config:
        names["cfg"] = _substitute(seed.config, names)
    templates = [t for _, t in seed.modules] or [seed.call]
    return "; ".join(cst.Module(body=[]).code_for_node(_substitute(t, names)) for t in templates)


# --------------------------------------------------------------------------------------------
# Composers
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Reject:
    """A composition that did not produce a task."""

    reason: str  # stable code: no_chain, no_seeds, verify_failed, label_mismatch; llm_* (llm.REJECT_REASONS)
    detail: str = ""


class Composer(Protocol):
    def compose(self, seeds: Sequence[Seed], k: int, rng: random.Random) -> Task | Reject: ...


COMPOSERS: dict[str, Callable[..., Composer]] = {}
# Composers whose module has heavy imports (openai, duckdb): registered when first named.
LAZY_COMPOSERS: Mapping[str, str] = {"llm": "cudagym.synth.llm"}


def register_composer(name: str):
    def decorator(factory):
        COMPOSERS[name] = factory
        return factory

    return decorator


@dataclass(frozen=True)
class ComposeConfig:
    composer: str = "programmatic"
    n_tasks: int = 100
    k_distribution: Mapping[int, float] = field(default_factory=lambda: dict(PAPER_K_DISTRIBUTION))
    seed: int = 0
    scale: int = 1  # multiplies every symbolic dim of the composed task (1: CPU-sized)
    allow_glue: bool = True  # insert x.flatten(k) where x has more dims than the next seed takes
    allow_unsqueeze: bool = False  # also x.unsqueeze(-1) where it has fewer (gives size-1 dims)
    family_weights: Mapping[str, float] = field(default_factory=dict)  # Seed.family -> weight; default 1
    final_dtypes: tuple[str, ...] = ("float32", "int64")  # dtypes a task may return
    max_attempts: int = 40  # chains started per compose() call
    max_candidates: int = 60  # seeds probed per chain position
    # Largest tensor (elements): each input, weight and intermediate. `scale` multiplies every dim, so
    # without it a rank-5 input grows with scale**5 (terabytes at 32). None: 2**22 (16 MB of float32)
    # times scale**2, at most 2**28 (1 GB): GPU-sized tasks reach the 1-100 ms window, yet a few of
    # them fit on one GPU at once.
    max_numel: int | None = None
    k_retries: int = 5  # compose() calls per sampled K before the step gives up on it
    llm: LLMConfig | None = None  # the llm composer's endpoint and limits (None: LLMConfig() from the env)

    def __post_init__(self):
        if self.composer not in COMPOSERS and self.composer in LAZY_COMPOSERS:
            importlib.import_module(LAZY_COMPOSERS[self.composer])
        if self.composer not in COMPOSERS:
            known = sorted(set(COMPOSERS) | set(LAZY_COMPOSERS))
            raise ValueError(f"unknown composer {self.composer!r}; known: {known}")
        ks = {int(k): float(p) for k, p in dict(self.k_distribution).items()}
        if not ks or any(k < 1 or k > 5 or p < 0 for k, p in ks.items()) or sum(ks.values()) <= 0:
            raise ValueError(f"k_distribution must weight K in 1..5: {self.k_distribution}")
        if self.scale < 1:
            raise ValueError("scale must be >= 1")
        if self.max_numel is None:
            object.__setattr__(self, "max_numel", min((1 << 22) * self.scale ** 2, 1 << 28))


def sample_k(distribution: Mapping[int, float], rng: random.Random) -> int:
    ks = sorted(distribution)
    return rng.choices(ks, weights=[distribution[k] for k in ks])[0]


def _accepts_input(seed: Seed, out_domain: str, out_dtype: str) -> bool:
    primary = seed.primary
    if primary.dtype != "float32" or out_dtype != "float32":
        return False
    return primary.domain == "randn" or out_domain in DOMAIN_ACCEPTS.get(primary.domain, frozenset())


@dataclass(frozen=True)
class _Chain:
    """A chain being grown: its steps, constant names, and what its output is (shape, dtype, domain)."""

    steps: list
    idents: Idents
    shape: tuple
    dtype: str
    domain: str


CPU_PROBE_NUMEL = 1 << 24  # elements (weights and inputs) a CPU shape-inference run may hold above scale 1


@register_composer("programmatic")
class ProgrammaticComposer:
    """Chains seeds whose shapes connect, found by meta-tensor shape inference; no LLM."""

    name = "programmatic"

    def __init__(self, config: ComposeConfig | None = None):
        self.config = config or ComposeConfig()
        self._probes: dict[tuple, tuple | None] = {}
        # Seeds without meta kernels are probed on the CPU: fine at scale 1, minutes and gigabytes at
        # GPU scale, where a chain through such a seed is given up instead.
        self._cpu_probe_numel = CPU_PROBE_NUMEL if self.config.scale > 1 else None

    # -- public ---------------------------------------------------------------------------
    def compose(self, seeds: Sequence[Seed], k: int, rng: random.Random) -> Task | Reject:
        pool = [s for s in seeds if s.ops]
        if not pool:
            return Reject("no_seeds", "no verified seeds")
        with single_threaded():
            for _ in range(self.config.max_attempts):
                chain = self._grow(pool, k, rng)
                if chain is not None:
                    return self._finish(chain)
        return Reject("no_chain", f"no chain of {k} connecting seeds in {self.config.max_attempts} attempts")

    def chain(self, seeds: Sequence[Seed]) -> Task | Reject:
        """Compose exactly these seeds, in this order."""
        with single_threaded():
            chain = self._start(seeds[0], last=len(seeds) == 1)
            for i, seed in enumerate(seeds[1:], 2):
                if chain is None:
                    break
                chain = self._extend(chain, seed, last=i == len(seeds))
            if chain is None:
                return Reject("no_chain", f"{' -> '.join(s.id for s in seeds)}: shapes, dtypes or domains do not connect")
            return self._finish(chain)

    # -- internals ------------------------------------------------------------------------
    def _probe(self, step: Step, idents: Idents) -> tuple | None:
        """(output shape, dtype) of one step fed x of step.x_shape, via meta tensors; None if it fails."""
        key = (step.seed.id, tuple(v for v, _ in step.x_shape), self.config.scale)
        if key not in self._probes:
            code = render_steps([replace(step, glue="")], idents.copy())
            try:
                shape, dtype, _ = infer_output(code, try_meta=step.seed.meta_ok, max_cpu_numel=self._cpu_probe_numel,
                                               max_tensor_numel=self.config.max_numel)
                self._probes[key] = (shape, dtype) if math.prod(shape) <= self.config.max_numel else None
            except (SeedError, Exception):  # noqa: BLE001 - shapes that do not connect
                self._probes[key] = None
        return self._probes[key]

    def _start(self, seed: Seed, last: bool) -> _Chain | None:
        idents = Idents()
        step = first_step(seed, idents, self.config.scale)
        return self._accept(_Chain([], idents, (), "", ""), step, idents, last)

    def _extend(self, chain: _Chain, seed: Seed, last: bool) -> _Chain | None:
        """The chain with `seed` appended, or None when it cannot take the chain's output."""
        if chain.steps[-1].seed.id == seed.id or not _accepts_input(seed, chain.domain, chain.dtype):
            return None
        idents = chain.idents.copy()
        cfg = self.config
        step = next_step(seed, chain.shape, idents, cfg.scale, cfg.allow_glue, cfg.allow_unsqueeze)
        return None if step is None else self._accept(chain, step, idents, last)

    def _accept(self, chain: _Chain, step: Step, idents: Idents, last: bool) -> _Chain | None:
        probe = self._probe(step, idents)
        if probe is None or (not last and not probe[0]):  # a scalar would feed nothing further
            return None
        if last and probe[1] not in self.config.final_dtypes:
            return None
        return _Chain(chain.steps + [step], idents, name_output(step, probe[0]), probe[1], step.seed.out_domain)

    def _weights(self, pool: Sequence[Seed]) -> list[float]:
        """Each family gets `family_weights[family]` (default 1) of the mass, split over its seeds."""
        sizes = Counter(s.family for s in pool)
        return [self.config.family_weights.get(s.family, 1.0) / sizes[s.family] for s in pool]

    def _order(self, pool: Sequence[Seed], weights: Sequence[float], rng: random.Random, n: int) -> list[Seed]:
        """n seeds drawn without replacement with the given weights (Efraimidis-Spirakis keys)."""
        keys = [(rng.random() ** (1.0 / w) if w > 0 else -1.0, i) for i, w in enumerate(weights)]
        return [pool[i] for key, i in sorted(keys, reverse=True)[:n] if key >= 0]

    def _grow(self, pool: Sequence[Seed], k: int, rng: random.Random) -> _Chain | None:
        weights = self._weights(pool)
        chain = self._start(self._order(pool, weights, rng, 1)[0], last=k == 1)
        while chain is not None and len(chain.steps) < k:
            last = len(chain.steps) == k - 1
            for seed in self._order(pool, weights, rng, self.config.max_candidates):
                extended = self._extend(chain, seed, last)
                if extended is not None:
                    chain = extended
                    break
            else:
                return None
        return chain

    def _finish(self, chain: _Chain) -> Task | Reject:
        steps, idents, shape = chain.steps, chain.idents, chain.shape
        seeds = [s.seed for s in steps]
        name = "_".join(s.name for s in seeds)
        doc = " -> ".join(s.name for s in seeds)
        code = render_steps(steps, idents, doc=doc)
        try:
            out_shape, _, _ = infer_output(code, try_meta=all(s.meta_ok for s in seeds),
                                           max_cpu_numel=self._cpu_probe_numel)
        except Exception as e:  # noqa: BLE001
            return Reject("verify_failed", f"{name}: {type(e).__name__}: {str(e)[:200]}")
        if tuple(out_shape) != tuple(v for v, _ in shape):
            return Reject("verify_failed", f"{name}: output {tuple(out_shape)}, expected {tuple(v for v, _ in shape)}")
        ops = ops_from_code(code)
        expected = [op for s in seeds for op in s.ops]
        if ops != expected:
            return Reject("label_mismatch", f"{name}: ops {ops} != seed ops {expected}")
        sha = sha256_text(code)
        provenance = {
            "composer": self.name, "k": len(seeds), "seed_ids": [s.id for s in seeds], "seed_ops": expected,
            "seed_kinds": [s.kind for s in seeds], "glue": [s.glue for s in steps], "ops": ops,
            "data_source": data_source_of(code), "scale": self.config.scale, "output_shape": list(out_shape),
        }
        return Task(id=f"synth/{sha[:12]}", name=name, code=code, level=1 if len(seeds) == 1 else 2,
                    source=f"synth:{self.name}", provenance=provenance)


def make_composer(config: ComposeConfig) -> Composer:
    return COMPOSERS[config.composer](config)


class ComposeStep:
    """Pipeline step: seeds in, `config.n_tasks` composed tasks out (deterministic given config.seed).
    `stats` counts `in` (compose calls), `kept` and `dropped_<reason>`; `rejects` keeps the rejects;
    `composer_stats` the composer's own counters after a run (the llm composer: requests, tokens)."""

    def __init__(self, config: ComposeConfig | None = None):
        self.config = config or ComposeConfig()
        self.stats: Counter = Counter()
        self.rejects: list[Reject] = []
        self.composer_stats: Counter = Counter()

    def run(self, seeds: Iterable[Seed]) -> Iterator[Task]:
        seeds = list(seeds)
        composer = make_composer(self.config)
        if hasattr(composer, "compose_batch"):
            yield from self._run_batched(seeds, composer)
            return
        rng = random.Random(self.config.seed)
        seen: set[str] = set()
        kept = 0
        budget = self.config.n_tasks * self.config.k_retries * 2
        while kept < self.config.n_tasks and self.stats["in"] < budget:
            k = sample_k(self.config.k_distribution, rng)
            for _ in range(self.config.k_retries):  # keep K as sampled, so the K mix follows the config
                self.stats["in"] += 1
                result = composer.compose(seeds, k, rng)
                if self._keep(result, k, seen):
                    kept += 1
                    yield result
                    break
        log.info("compose (%s): %s", self.config.composer, dict(self.stats))

    def _keep(self, result: Task | Reject, k: int, seen: set[str]) -> bool:
        """Count one composition of K seeds: a reject or a duplicate is dropped, a new task kept."""
        if isinstance(result, Reject):
            self.stats[f"dropped_{result.reason}"] += 1
            self.rejects.append(result)
            return False
        if result.sha256 in seen:
            self.stats["dropped_duplicate"] += 1
            return False
        seen.add(result.sha256)
        self.stats["kept"] += 1
        self.stats[f"k{k}"] += 1
        return True

    def _run_batched(self, seeds: list[Seed], composer) -> Iterator[Task]:
        """`run` for a composer with `pick(seeds, k, rng)`, `compose_batch([(seeds, k), ...])` and
        `concurrency` (the llm composer): K and the seeds are drawn here, with the step's rng, then up
        to `concurrency` compositions run at once. Results are taken in request order, so the output
        depends only on config.seed (and the answers). A rejected (or duplicate) K is queued again, up
        to `k_retries` tries, so the K mix follows the config as in `run`."""
        cfg = self.config
        rng = random.Random(cfg.seed)
        seen: set[str] = set()
        kept = 0
        budget = cfg.n_tasks * cfg.k_retries * 2
        again: deque[tuple[int, int]] = deque()  # (K, tries so far) to compose again
        width = max(1, int(getattr(composer, "concurrency", 1)))
        try:
            while kept < cfg.n_tasks and self.stats["in"] < budget:
                slots = [again.popleft() if again else (sample_k(cfg.k_distribution, rng), 0)
                         for _ in range(min(width, cfg.n_tasks - kept, budget - self.stats["in"]))]
                requests = [(composer.pick(seeds, k, rng), k) for k, _ in slots]
                for (k, tries), result in zip(slots, composer.compose_batch(requests)):
                    self.stats["in"] += 1
                    if self._keep(result, k, seen):
                        kept += 1
                        yield result
                    elif tries + 1 < cfg.k_retries:
                        again.append((k, tries + 1))
        finally:
            self.composer_stats = Counter(getattr(composer, "stats", {}))
            if hasattr(composer, "close"):
                composer.close()
        log.info("compose (%s): %s; composer: %s", cfg.composer, dict(self.stats), dict(self.composer_stats))


def compose_tasks(seeds: Iterable[Seed], config: ComposeConfig | None = None) -> list[Task]:
    return list(ComposeStep(config).run(seeds))
