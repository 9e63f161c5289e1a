"""Dataset labels read from a task's AST: `ops` (operator names in evaluation order) and
`data_source` (`torch#K` or `transformers`). Never taken from a composer's (or a model's) claim.
Pure `ast`: no other synth module is imported, so every stage can label.
"""

from __future__ import annotations

import ast
from typing import Mapping

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
# CUDA-Agent-Ops-6K as released (6,000 rows): rows per data_source, what a build is compared with.
OPS_6K_SOURCES: Mapping[str, int] = {"torch#1": 204, "torch#2": 5026, "torch#3": 457, "torch#4": 168, "torch#5": 74,
                                     "transformers": 71}


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
