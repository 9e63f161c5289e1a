"""benchmarks/fast_timing_report.py and the trace it reads (timing.write_trace): per-problem medians,
speedups by the strict window and by the busy-start window, their differences between two runs, on
traces written here with known values."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from cudagym.eval import timing

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("fast_timing_report", REPO / "benchmarks" / "fast_timing_report.py")
report = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(report)


def _write_run(path: Path, monkeypatch, problems: dict, span: bool = True) -> None:
    """problems: {hash: (candidate window, eager window, candidate busy, eager busy)} in ms (span: a tenth of
    busy, the same in every run); three reps each,
    the middle one at the given value (the medians), a baseline job's reps that must be ignored."""
    monkeypatch.setenv(timing.TRACE_ENV, str(path))
    for problem, (cw, ew, cb, eb) in problems.items():
        for k in (0.9, 1.0, 1.3):
            for role, w, b in (("candidate", cw, cb), ("eager", ew, eb)):
                parts = {"window_ms": w * k, "stream_ms": w * k / 2, "busy_ms": b * k, "host_call_us": 10.0,
                         "host_sync_us": 5.0}
                if span:
                    parts["span_ms"] = b * k / 10
                timing.write_trace(parts, role=role, problem=problem, mode="eval", pid=1)
        timing.write_trace({"window_ms": 99.0, "busy_ms": 99.0}, role="eager", problem=problem, mode="baseline", pid=2)
        # the eval judge's own reference reps: beside compile, not beside the candidate (an older trace's
        # `eager` after `compile`, and the role written now)
        for role in ("compile", "eager", "reference_eager"):
            timing.write_trace({"window_ms": 77.0, "busy_ms": 77.0}, role=role, problem=problem, mode="eval", pid=1)


def test_speedups_by_window_and_busy_compared_between_runs(tmp_path, monkeypatch):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    # window speedups move between runs (host path), busy ones do not; p3 is slow and left out
    _write_run(a, monkeypatch, {"p1": (0.080, 0.064, 0.010, 0.011), "p2": (0.150, 0.170, 0.050, 0.060),
                                "p3": (0.500, 0.600, 0.400, 0.500)})
    _write_run(b, monkeypatch, {"p1": (0.086, 0.058, 0.010, 0.011), "p2": (0.160, 0.200, 0.050, 0.060),
                                "p3": (0.500, 0.500, 0.400, 0.500)})
    with a.open("a") as f:
        f.write('{"window_ms": 1.0, "role": "cand')  # a run stopped mid-write
    ra, rb = report.summary(report.load(a)), report.summary(report.load(b))
    assert ra["p1"]["reps"] == 3 and ra["p1"]["candidate_window_ms"] == pytest.approx(0.080)
    assert ra["p1"]["speedup_window"] == pytest.approx(0.8) and ra["p1"]["speedup_busy"] == pytest.approx(1.1)
    result = report.compare(ra, rb)
    assert result["problems"] == ["p1", "p2"]
    w1 = abs((0.064 / 0.080) / (0.058 / 0.086) - 1)
    w2 = abs((0.170 / 0.150) / (0.200 / 0.160) - 1)
    assert result["window"]["median_rel_diff"] == pytest.approx((w1 + w2) / 2)
    assert result["window"]["max_rel_diff"] == pytest.approx(max(w1, w2))
    assert result["busy"]["median_rel_diff"] == pytest.approx(0.0)
    assert result["span"]["median_rel_diff"] == pytest.approx(0.0) and ra["p1"]["speedup_span"] == pytest.approx(1.1)
    text = report.markdown(ra, rb, result, {"p1": "L1/21 Sigmoid"})
    assert "L1/21 Sigmoid" in text and "busy: 2 problems" in text and "span: 2 problems" in text


def test_cli_writes_report_and_refuses_missing_trace(tmp_path, monkeypatch, capsys):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    _write_run(a, monkeypatch, {"p1": (0.05, 0.05, 0.01, 0.01)}, span=False)  # a trace from before span existed
    _write_run(b, monkeypatch, {"p1": (0.05, 0.04, 0.01, 0.01)}, span=False)
    out = tmp_path / "r.json"
    assert report.main([str(a), str(b), "--out-json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["compare"]["window"]["median_rel_diff"] == pytest.approx(0.25)
    assert data["compare"]["span"]["median_rel_diff"] is None and data["a"]["p1"]["speedup_span"] is None
    with pytest.raises(SystemExit) as exc:
        report.main([str(a), str(tmp_path / "missing.jsonl")])
    assert exc.value.code == 2 and "no trace" in capsys.readouterr().err


def test_trace_is_off_unless_asked_and_never_on_cpu(tmp_path, monkeypatch):
    monkeypatch.delenv(timing.TRACE_ENV, raising=False)
    timing.write_trace({"window_ms": 1.0}, role="eager")  # no file named: nothing written, no error
    monkeypatch.setenv(timing.TRACE_ENV, str(tmp_path / "t.jsonl"))
    assert timing.Timer("cpu").trace is False  # the CPU path has no events to take apart
    timing.write_trace(None, role="eager")
    assert not (tmp_path / "t.jsonl").exists()


def test_trace_write_failure_is_silent(tmp_path, monkeypatch):
    """A trace file the process may not write (a judge's sandbox) leaves the judge's work alone."""
    monkeypatch.setenv(timing.TRACE_ENV, str(tmp_path / "missing-dir" / "t.jsonl"))
    timing.write_trace({"window_ms": 1.0}, role="eager")
    assert not (tmp_path / "missing-dir").exists()
