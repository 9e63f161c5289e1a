"""benchmarks/train_gpu.py at tiny settings on the CPU: every stage runs (TRL's only where trl is installed)
and records its step time and tokens/s; bad input is one line and exit 2."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # ~1 min: two SFT steps, two value steps, one PPO step with the real loop and judge

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))


def test_every_stage_times_its_steps(store_path, smollm2_tokenizer, smollm2_cache_dir, tmp_path):
    import train_gpu

    out, work = tmp_path / "bench", tmp_path / "work"
    argv = ["--db", str(store_path), "--out", str(out), "--work-dir", str(work), "--device", "cpu", "--arch", "tiny",
            "--tokenizer", str(smollm2_cache_dir), "--tools", "bash,read_file,verify",  # the store fixture's tools
            "--sft-steps", "2", "--value-steps", "2", "--ppo-steps", "1", "--ppo-tasks", str(REPO / "examples" / "problems"),
            "--ppo-ids", "3", "--ppo-rollouts", "2", "--ppo-max-new-tokens", "8", "--deadline-s", "300"]
    assert train_gpu.main(argv) == 0
    results = json.loads((out / "train_gpu.json").read_text())
    stages = results["stages"]
    assert results["samples"]["sft"] == 2  # quick and quick_text pass the RFT selection
    for name in ("rft", "value", "ppo"):
        assert "error" not in stages[name], stages[name]
        assert stages[name]["step_s"] > 0 and stages[name]["tokens_per_s"] > 0, name
    assert stages["rft"]["steps"] == 2 and stages["value"]["steps"] == 2 and stages["ppo"]["steps"] == 1
    assert stages["rft"]["model_tokens_per_s"] > 0 and len(stages["rft"]["loss"]) == 2
    assert len(stages["value"]["explained_variance"]) == 2
    assert stages["ppo"]["generate_tokens_per_s"] > 0 and len(stages["ppo"]["kl"]) == 1
    trl = stages["trl_sft"]
    if importlib.util.find_spec("trl") is None:
        assert trl["skipped"].startswith("TRL not importable")
    else:
        assert trl["step_s"] > 0 and trl["tokens_per_s"] > 0 and trl["tokens_per_step"] == stages["rft"]["tokens_per_step"]
        # the same model, samples and masked tokens: the first step's loss is ours (TRL logs it rounded)
        assert trl["loss"][0] == pytest.approx(stages["rft"]["loss"][0], abs=1e-3)
    table = (out / "train_gpu.md").read_text()
    assert all(f"| {name} |" in table for name in stages)
    # the report alone where a device call returns files; models and checkpoints in the work folder
    assert sorted(p.name for p in out.iterdir()) == ["train_gpu.json", "train_gpu.md"]
    assert (work / "model" / "config.json").is_file() and (work / "rft").is_dir()


def test_bad_input_is_one_line(tmp_path, capsys):
    import train_gpu

    assert train_gpu.main(["--db", str(tmp_path / "missing.duckdb"), "--out", str(tmp_path / "o"), "--device", "cpu"]) == 2
    assert capsys.readouterr().err.strip() == f"train_gpu: no trajectory store at {tmp_path / 'missing.duckdb'}"
