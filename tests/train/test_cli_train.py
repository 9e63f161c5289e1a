"""`cudagym train rft` on a trajectory store the real agent loop wrote (fixture store_path)."""

from __future__ import annotations

import pytest

from cudagym.cli import main

pytestmark = pytest.mark.slow  # shares the ~10 s store fixture with test_trajectories


def test_train_rft_writes_the_kept_set(store_path, tmp_path, capsys):
    import datasets

    out = tmp_path / "rft"
    assert main(["train", "rft", str(store_path), "--out", str(out)]) == 0
    line = capsys.readouterr().out.strip()
    # quick and quick_text kept; slow_kernel (reward 1), chatty (max_turns), malformed (its calls) dropped
    assert line.startswith("kept 2 of 5 finished rollouts (dropped: invalid_call 1, low_reward 1, unfinished 1)")
    rows = datasets.load_dataset(str(out), split="train", cache_dir=str(tmp_path / "cache"))
    assert sorted(rows["rollout_id"]) == ["quick", "quick_text"]
    # a lower threshold also keeps the correct-but-slow rollout
    assert main(["train", "rft", str(store_path), "--out", str(tmp_path / "rft0"), "--min-reward", "0"]) == 0
    assert capsys.readouterr().out.startswith("kept 3 of 5")


@pytest.mark.parametrize("argv, message", [
    (["train", "rft", "{missing}", "--out", "{out}"], "no trajectory store"),
    (["train", "rft", "{store}", "--out", "{existing}"], "already exists"),
    (["train", "rft", "{store}", "--out", "{out}", "--max-identical-calls", "0"], "max_identical_calls_in_a_row"),
    (["train", "rft", "{store}"], "--out"),
])
def test_train_rft_bad_input_is_one_line(store_path, tmp_path, capsys, argv, message):
    names = {"missing": str(tmp_path / "nothing.duckdb"), "out": str(tmp_path / "new"), "store": str(store_path),
             "existing": str(tmp_path)}
    assert main([a.format(**names) for a in argv]) == 1
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_train_value_pretrains_and_saves_a_critic(store_path, tiny_checkpoint, tmp_path, capsys):
    import json

    from cudagym.train.critic import ValueModel

    out = tmp_path / "value"
    # the toy's learning rate (the paper's 6e-6 moves a random 16-wide head nowhere in 20 steps)
    argv = ["train", "value", str(store_path), "--model", str(tiny_checkpoint), "--out", str(out), "--lr", "5e-2",
            "--max-steps", "20", "--patience", "20", "--mini-batch", "1", "--micro-batch", "1", "--lam", "1", "--json"]
    assert main(argv) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["rollouts"] == 5 and summary["skipped"] == {}
    saved = json.loads((out / "value_curve.json").read_text())
    curve = [row["explained_variance"] for row in saved["curve"]]
    assert curve[0] == pytest.approx(0.0, abs=1e-6)  # the zero-initialised head
    # lambda 1: the target of every model token is its rollout's reward (rollouts differ from their first
    # turn on); a critic that tells them apart explains most of the variance (0.84 at best here)
    assert summary["best_explained_variance"] == max(curve) > 0.5
    assert summary["steps"] == len(curve) and summary["stopped"]
    critic = ValueModel.load(out / "critic")
    assert critic.head.weight.abs().sum() > 0  # the fitted head, not a fresh zero one


def test_train_value_bad_model_is_one_line(store_path, tmp_path, capsys):
    assert main(["train", "value", str(store_path), "--model", str(tmp_path), "--out", str(tmp_path / "v")]) == 1
    err = capsys.readouterr().err
    assert "not a transformers checkpoint" in err and len(err.strip().splitlines()) == 1


def test_train_rft_with_a_model_fine_tunes_and_resumes(store_path, tiny_checkpoint, tmp_path, capsys):
    out = tmp_path / "rft"
    argv = ["train", "rft", str(store_path), "--out", str(out), "--model", str(tiny_checkpoint), "--epochs", "1",
            "--min-reward", "0"]
    assert main(argv) == 0
    line = capsys.readouterr().out.strip()
    # reward > 0 keeps quick, quick_text and slow_kernel (the fixture's tools are all kernel-environment tools)
    assert line.startswith("fine-tuned on 3 rollouts") and "in 1 steps" in line
    assert (out / "checkpoint" / "config.json").is_file() and (out / "README.md").is_file()
    assert main(argv) == 0  # a rerun: the finished stage is reported, not redone
    assert capsys.readouterr().out.strip() == line


def test_train_ppo_verl_has_no_launcher_yet(tmp_path, capsys):
    assert main(["train", "ppo", "--engine", "verl", "--model", str(tmp_path), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "no verl launcher yet" in err and "default_agent_loop=cudagym_agent" in err and len(err.strip().splitlines()) == 1


def test_train_ppo_bad_model_is_one_line(tmp_path, capsys):
    assert main(["train", "ppo", "--tasks", "examples/problems", "--model", str(tmp_path), "--out", str(tmp_path / "o")]) == 1
    err = capsys.readouterr().err
    assert "not a transformers checkpoint" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("stage", ["rft", "value"])
@pytest.mark.parametrize("device, message", [("cuda", "no CUDA GPU is visible"), ("tpu", "cpu, cuda or cuda:N")])
def test_train_device_without_a_gpu_is_one_line(store_path, tiny_checkpoint, tmp_path, capsys, stage, device, message):
    import torch

    if device == "cuda" and torch.cuda.is_available():
        pytest.skip("a GPU is visible here: cuda is a valid --train-device")
    argv = ["train", stage, str(store_path), "--model", str(tiny_checkpoint), "--out", str(tmp_path / "o"),
            "--train-device", device]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "o").exists()  # refused before anything was written
