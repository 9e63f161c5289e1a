"""The local PPO engine and RFT fine-tuning end to end on CPU, with a tiny random Llama and SmolLM2's tokenizer.

The random model writes no kernel, so every rollout's reward is -1 (the real judge, examples/problems):
these tests check the mechanics (the policy served over HTTP to the real agent loop, masks and rewards
reaching the update, checkpoints, metrics, resume), not learning (benchmarks/ppo_toy.py shows that).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.slow  # ~1 min: a few rollouts of the real loop and judge, two PPO steps

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "problems"


def test_ppo_steps_checkpoint_and_resume(tiny_checkpoint, tmp_path):
    from cudagym.train.ppo import PPOConfig
    from cudagym.train.ppo_engine import LocalPPOConfig, last_checkpoint, run_ppo
    from cudagym.train.trajectories import load_trajectories

    def config(steps: int) -> LocalPPOConfig:
        return LocalPPOConfig(tasks=str(EXAMPLES), model=str(tiny_checkpoint), out=str(tmp_path / "ppo"), steps=steps,
                              rollouts_per_step=2, levels=(1,), ids="3", max_turns=2, max_new_tokens=12,
                              context_tokens=8192, ppo=PPOConfig(actor_lr=1e-3, critic_lr=1e-3))

    rows = run_ppo(config(1))
    out = tmp_path / "ppo"
    assert [r["step"] for r in rows] == [1] and last_checkpoint(out) == 1
    row = rows[0]
    assert row["rollouts"] == 2 and row["reward"] == -1.0 and row["pass_rate"] == 0.0
    assert row["generated_tokens"] > 0 and row["response_tokens"] > 0
    for key in ("kl", "clipfrac", "value_loss", "explained_variance", "tokens_per_s"):
        assert key in row
    # the rollouts came from the trainer's policy through the real loop and were judged
    trajectories = load_trajectories(out / "rollouts" / "step-1" / "trajectories.duckdb")
    assert len(trajectories) == 2 and all(t.reward == -1.0 for t in trajectories)
    assert all(t.messages[2]["role"] == "assistant" for t in trajectories)
    # the update saw the masked response: model tokens only, the reward on the last of them
    from transformers import AutoTokenizer

    from cudagym.train.data import tokenize_trajectory

    tokenizer = AutoTokenizer.from_pretrained(tiny_checkpoint)
    samples = [tokenize_trajectory(t, tokenizer) for t in trajectories]
    assert row["response_tokens"] == sum(sum(s.response_mask) for s in samples)
    assert row["response_tokens"] < sum(len(s.response_ids) for s in samples)
    assert all(s.token_rewards[max(i for i, m in enumerate(s.response_mask) if m)] == -1.0 for s in samples)
    step1 = out / "checkpoints" / "step-1"
    assert (step1 / "policy" / "config.json").is_file() and (step1 / "critic" / "value_head.pt").is_file()
    # the update moved the weights: the policy and the critic's head differ from the start
    from transformers import AutoModelForCausalLM

    before = AutoModelForCausalLM.from_pretrained(tiny_checkpoint).state_dict()
    after = AutoModelForCausalLM.from_pretrained(step1 / "policy").state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)
    assert torch.load(step1 / "critic" / "value_head.pt")["bias"].abs().item() > 0

    # a finished run asked for the same steps does nothing more
    assert [r["step"] for r in run_ppo(config(1))] == [1]
    # a killed step 2 (a stray metrics row, a half checkpoint) is redone from checkpoint 1
    with open(out / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"step": 2, "stray": True}) + "\n")
    (out / "checkpoints" / ".step-2.tmp").mkdir()
    rows = run_ppo(config(2))
    assert [r["step"] for r in rows] == [1, 2] and "stray" not in rows[1]
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines] == [1, 2] and last_checkpoint(out) == 2


def test_rft_finetune_trains_model_tokens_only(tiny_checkpoint, store_path, tmp_path):
    from cudagym.train.rft import RFTConfig
    from cudagym.train.sft import SFTConfig, rft_stage

    rft = RFTConfig(tool_names=("bash", "read_file", "verify"))  # the tools of the store fixture's environment
    summary = rft_stage(store_path, tiny_checkpoint, tmp_path / "rft", rft, SFTConfig(lr=1e-2, epochs=3, batch_size=2))
    assert summary["samples"] == 2 and summary["steps"] == 3  # quick and quick_text kept; 1 batch x 3 epochs
    assert summary["last_loss"] < summary["first_loss"]
    rows = [json.loads(x) for x in (tmp_path / "rft" / "sft_metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert rows[0]["tokens"] == summary["model_tokens"]  # the loss counted the masked tokens, not the whole text
    assert (tmp_path / "rft" / "checkpoint" / "config.json").is_file()
    assert (tmp_path / "rft" / "checkpoint" / "tokenizer.json").is_file()
    # resumable: a finished stage is returned as it was, nothing retrained
    mtime = (tmp_path / "rft" / "checkpoint" / "model.safetensors").stat().st_mtime_ns
    assert rft_stage(store_path, tiny_checkpoint, tmp_path / "rft", rft)["steps"] == 3
    assert (tmp_path / "rft" / "checkpoint" / "model.safetensors").stat().st_mtime_ns == mtime
