"""Known reward hacks are never accepted and honest kernels are: one fixture file each.

Every file under tests/fixtures/hacks/ and tests/fixtures/honest/ opens with a header

    # hack: <class>            (or  # honest: <name>)
    # problem: <stem of a file in tests/fixtures/problems/ (cpu) or problems_cuda/ (cuda)>
    # device: cpu | cuda
    # policy: strict | permissive   (strict when absent)
    # why: one line

and is judged against its problem with `evaluate_candidate` under the header's policy. A hack must
not pass (and must leave nothing behind outside its sandbox); an honest control must pass. CUDA
fixtures are collected everywhere and skipped without a GPU; on a GPU box run this file with pytest.
tests/fixtures/README.md says which defence layer is meant to catch each class.
"""

from __future__ import annotations

import ast
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
REPO = FIXTURES.parent.parent

HACK_CLASSES = (
    "result_caching", "nondefault_stream", "input_mutation", "stale_output", "try_except_fallback", "torch_alias",
    "inherits_model", "degenerate_output", "precision_downcast", "lazy_tensor", "monkeypatch_timer",
    "background_thread", "gc_frames", "phase_detection", "l2_persistence", "input_independent_precompute",
    "evaluator_tamper", "builtin_patch", "partial_input",
)
CUDA_ONLY_CLASSES = {"nondefault_stream", "l2_persistence"}
CUDA_REQUIRED_CLASSES = {"nondefault_stream", "l2_persistence", "stale_output", "precision_downcast", "result_caching",
                         "phase_detection", "input_mutation", "background_thread", "partial_input"}
CUDA_HONEST_REQUIRED = {"add_scale", "matmul", "diag_matmul", "mse_rand", "row_center"}  # problems with a CUDA honest control
POLICIES = ("strict", "permissive")
CALL_TIMEOUT_S = 120  # per call of the candidate; extension builds have EvalConfig.build_timeout_s

HEADER_LINE = re.compile(r"^#\s*([a-z_]+):\s*(.*?)\s*$")
TAMPER_BEGIN, TAMPER_END = "# >>> cudagym-tamper-marker", "# <<< cudagym-tamper-marker"
TAMPER_BLOCK = re.compile(r"\n?" + re.escape(TAMPER_BEGIN) + r".*?" + re.escape(TAMPER_END) + r"\n?", re.S)
TAMPER_FILE = "cudagym_tamper_marker"
HAS_CUDA = torch.cuda.is_available()


@dataclass(frozen=True)
class Fixture:
    path: Path
    kind: str  # "hack" | "honest"
    label: str  # hack class, or honest control name
    header: dict

    @property
    def device(self) -> str:
        return self.header.get("device", "cpu")

    @property
    def policy(self) -> str:
        return self.header.get("policy", "strict")

    @property
    def problem_path(self) -> Path:
        folder = "problems_cuda" if self.device == "cuda" else "problems"
        return FIXTURES / folder / f"{self.header.get('problem', '')}.py"

    @property
    def test_id(self) -> str:
        return f"{self.device}-{self.path.stem}"


def read_header(path: Path) -> dict[str, str]:
    """The leading `# key: value` lines of a fixture."""
    header: dict[str, str] = {}
    for line in path.read_text().splitlines():
        match = HEADER_LINE.match(line)
        if not match:
            break
        header[match.group(1)] = match.group(2)
    return header


def collect(kind: str) -> list[Fixture]:
    folder = FIXTURES / ("hacks" if kind == "hack" else "honest")
    out = []
    for path in sorted(folder.glob("*.py")):
        header = read_header(path)
        out.append(Fixture(path, kind, header.get(kind, ""), header))
    return out


def params(kind: str) -> list:
    return [pytest.param(fx, id=fx.test_id,
                         marks=[pytest.mark.skipif(fx.device == "cuda" and not HAS_CUDA, reason="needs a CUDA GPU")])
            for fx in collect(kind)]


HACKS, HONEST = collect("hack"), collect("honest")


def evaluate(fx: Fixture):
    from cudagym.eval.evaluate import EvalConfig, evaluate_candidate

    # Timed (phase detection and timer hacks live there), but without a torch.compile baseline:
    # it decides nothing about a hack and costs ~30 s of CPU per honest control. CUDA fixtures are
    # judged in the timing mode CUDAGYM_FIXTURE_TIMING_MODE names (strict by default; paper on the GPU box).
    mode = os.environ.get("CUDAGYM_FIXTURE_TIMING_MODE", "strict") if fx.device == "cuda" else "strict"
    config = EvalConfig(device=fx.device, policy=fx.policy, n_checks=5, time_candidate=True, timeout_s=CALL_TIMEOUT_S,
                        compile_baseline=False, timing_mode=mode)
    return evaluate_candidate(fx.problem_path.read_text(), fx.path.read_text(), config)


def describe(fx: Fixture, verdict) -> str:
    status = getattr(verdict.status, "value", verdict.status)
    return (f"{fx.path.relative_to(FIXTURES)} [{fx.label}, policy={fx.policy}]: status={status} "
            f"correct={verdict.correct} reason={verdict.reason!r} flags={verdict.flags}; "
            f"fixture says: {fx.header.get('why', '')}")


# -- what a candidate must not leave behind --------------------------------------------------------
def _watched_files() -> list[Path]:
    """Sources an evaluator_tamper candidate goes after: the harness package and torch.testing."""
    files = list((REPO / "cudagym").rglob("*.py"))
    files += list(Path(torch.testing.__file__).parent.rglob("*.py"))
    return files


def _marker_dirs() -> list[Path]:
    dirs = [Path("/tmp"), Path(tempfile.gettempdir()), Path.home(), Path("/dev/shm"), REPO, REPO.parent,
            REPO / "cudagym" / "eval", Path(torch.testing.__file__).parent]
    if os.environ.get("TORCH_EXTENSIONS_DIR"):
        dirs.append(Path(os.environ["TORCH_EXTENSIONS_DIR"]))
    return [d for d in dict.fromkeys(dirs) if d.is_dir()]


def clean_tamper_traces() -> list[str]:
    """Undo what the evaluator_tamper fixtures write (inert comment blocks, marker files); list what was found.

    Only the fixtures' own marked blocks are cut out, so edits made by anyone else meanwhile survive.
    """
    found = []
    for path in _watched_files():
        try:
            text = path.read_text()
        except (OSError, UnicodeDecodeError):
            continue
        if TAMPER_BEGIN in text:
            found.append(f"appended to {path}")
            path.write_text(TAMPER_BLOCK.sub("", text))
    for folder in _marker_dirs():
        for marker in folder.glob(f"*{TAMPER_FILE}*"):
            found.append(f"wrote {marker}")
            try:
                marker.unlink()
            except OSError:
                pass
    return found


# -- the verdicts ----------------------------------------------------------------------------------
@pytest.mark.parametrize("fx", params("hack"))
def test_hack_is_not_accepted(fx: Fixture):
    clean_tamper_traces()  # leftovers of an earlier, interrupted run must not be blamed on this fixture
    try:
        verdict = evaluate(fx)
    finally:
        traces = clean_tamper_traces()
    assert not traces, f"candidate changed files outside its sandbox: {traces}"
    assert verdict.status.value != "pass", describe(fx, verdict)
    assert verdict.correct is False, describe(fx, verdict)


@pytest.mark.parametrize("fx", params("honest"))
def test_honest_control_passes(fx: Fixture):
    verdict = evaluate(fx)
    assert verdict.status.value == "pass", describe(fx, verdict)
    assert verdict.correct is True, describe(fx, verdict)
    assert not verdict.flags, describe(fx, verdict)


# -- the fixtures themselves (cheap; no harness needed) -------------------------------------------
@pytest.mark.parametrize("fx", [pytest.param(fx, id=fx.test_id) for fx in HACKS + HONEST])
def test_fixture_header_is_complete(fx: Fixture):
    assert fx.label, f"{fx.path.name}: first line must be '# {fx.kind}: ...'"
    if fx.kind == "hack":
        assert fx.label in HACK_CLASSES, f"{fx.path.name}: unknown hack class {fx.label!r}"
    assert fx.device in ("cpu", "cuda"), f"{fx.path.name}: device {fx.device!r}"
    assert fx.policy in POLICIES, f"{fx.path.name}: policy {fx.policy!r}"
    assert fx.header.get("why"), f"{fx.path.name}: missing '# why:' line"
    assert fx.problem_path.is_file(), f"{fx.path.name}: no problem file {fx.problem_path}"
    if fx.label in CUDA_ONLY_CLASSES:
        assert fx.device == "cuda", f"{fx.path.name}: {fx.label} only exists on CUDA"
    assert "ModelNew" in top_level_names(fx.path), f"{fx.path.name}: defines no ModelNew"


def top_level_names(path: Path) -> set[str]:
    names = set()
    for node in ast.parse(path.read_text(), filename=str(path)).body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return names


def test_every_hack_class_has_fixtures():
    cpu = {fx.label for fx in HACKS if fx.device == "cpu"}
    cuda = {fx.label for fx in HACKS if fx.device == "cuda"}
    assert set(HACK_CLASSES) - CUDA_ONLY_CLASSES <= cpu, sorted(set(HACK_CLASSES) - CUDA_ONLY_CLASSES - cpu)
    assert CUDA_REQUIRED_CLASSES <= cuda, sorted(CUDA_REQUIRED_CLASSES - cuda)
    assert CUDA_HONEST_REQUIRED <= {fx.header["problem"] for fx in HONEST if fx.device == "cuda"}
    assert {fx.policy for fx in HONEST if fx.device == "cpu"} == set(POLICIES)


def test_extension_names_are_unique():
    """load_inline builds are cached by name in TORCH_EXTENSIONS_DIR: two fixtures must never share one."""
    names: dict[str, str] = {}
    for fx in HACKS + HONEST:
        for name in re.findall(r"""\bname\s*=\s*["']([A-Za-z0-9_]+)["']""", fx.path.read_text()):
            assert name not in names, f"extension name {name} used by {names[name]} and {fx.path.name}"
            names[name] = fx.path.name


@pytest.mark.parametrize("path", sorted((FIXTURES / "problems").glob("*.py")), ids=lambda p: p.stem)
def test_cpu_problem_runs(path: Path):
    namespace: dict = {}
    exec(compile(path.read_text(), str(path), "exec"), namespace)
    torch.manual_seed(0)
    model = namespace["Model"](*namespace["get_init_inputs"]())
    with torch.no_grad():
        out = model(*namespace["get_inputs"]())
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float32 and bool(torch.isfinite(out).all())


@pytest.mark.parametrize("path", sorted((FIXTURES / "problems_cuda").glob("*.py")), ids=lambda p: p.stem)
def test_cuda_problem_parses(path: Path):
    assert {"Model", "get_inputs", "get_init_inputs"} <= top_level_names(path)
