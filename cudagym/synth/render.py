"""Binding seed shapes and writing KernelBench-format source with libcst.

A chain of seeds is a list of `Step`s: each seed with its bound dims, the shape x has when it
arrives and the view (`glue`) applied first. `render_steps` writes the fused `Model`,
`get_inputs` and `get_init_inputs`; `seed_task` / `seed_snippet` render one seed alone (the crawl
verifies seeds through them, the llm composer's prompt quotes the snippet).
"""

from __future__ import annotations

import ast
import functools
import math
import re
from dataclasses import dataclass, replace
from typing import Mapping, Sequence

import libcst as cst

from cudagym.synth.seeds import DIMS, DOMAINS, LIKE_X, InputSpec, Seed
from cudagym.tasks import Task

BASE_IMPORTS = ("import torch", "import torch.nn as nn", "import torch.nn.functional as F")

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
    """The KernelBench task of a single seed alone; every symbolic dim times `scale` (1: CPU-sized)."""
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
