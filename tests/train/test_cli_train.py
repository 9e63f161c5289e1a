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
