"""Value pretraining: fit the critic to GAE returns on collected trajectories, the actor frozen.

CUDA Agent pretrains its critic before PPO (without it the faster-than-compile rate fell from 96.8%
to 50.9%, and runs collapsed): a critic that starts at zero gives PPO advantages that are mostly
noise. verl's version is `trainer.critic_warmup=N`: N PPO iterations that update only the critic.
Here it runs on a fixed set of trajectories (the RFT rollouts): each step recomputes the critic's
values, the GAE returns they imply (gamma, lambda of PPOConfig) and one epoch of critic steps over
shuffled mini-batches (ppo.critic_step: the clipped value loss PPO itself uses), until the explained
variance of the values against the returns stops improving (`patience` steps without a gain of
`min_delta`) or `max_steps`. The curve is returned so that the stage can record it.

`value_stage` is the stage `cudagym train value` runs: every judged rollout of an agent store
(the critic must learn bad outcomes as well as good ones), tokenized with the model's chat template,
a critic built from the model's decoder, pretrained, saved with its curve.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from cudagym.train.ppo import ADVANTAGE_ESTIMATORS, PPOBatch, PPOConfig, critic_step, explained_variance, rollout_values


@dataclass(frozen=True)
class ValuePretrainConfig:
    max_steps: int = 200  # epochs over the trajectories at most
    patience: int = 5  # stop after this many steps without an explained-variance gain of min_delta
    min_delta: float = 0.01

    def __post_init__(self) -> None:
        if self.max_steps < 1 or self.patience < 1:
            raise ValueError(f"max_steps and patience must be >= 1, got {self.max_steps}, {self.patience}")
        if self.min_delta < 0:
            raise ValueError(f"min_delta must be >= 0, got {self.min_delta}")


def pretrain_value(critic: torch.nn.Module, batch: PPOBatch, optimizer: torch.optim.Optimizer, ppo: PPOConfig,
                   config: ValuePretrainConfig = ValuePretrainConfig(), generator: torch.Generator | None = None,
                   on_step: Callable[[dict], None] | None = None) -> list[dict]:
    """Fit `critic` on `batch` until its explained variance plateaus; returns one dict per step:
    step, explained_variance (before the step's updates), vf_loss, vf_clipfrac, stopped ("" or why)."""
    n = batch.input_ids.shape[0]
    mask = batch.response_mask.float()
    curve: list[dict] = []
    best, since_best = -math.inf, 0
    for step in range(1, config.max_steps + 1):
        values = rollout_values(critic, batch, ppo)
        _, returns = ADVANTAGE_ESTIMATORS["gae"](batch.token_rewards, values, mask, ppo.gamma, ppo.lam)
        ev = explained_variance(values, returns, mask)
        sums: dict[str, float] = {}
        minis = torch.randperm(n, generator=generator).split(ppo.mini_batch_size)
        for mini in minis:
            for key, value in critic_step(critic, optimizer, batch, mini, values, returns, ppo).items():
                sums[key] = sums.get(key, 0.0) + value / len(minis)
        row = {"step": step, "explained_variance": ev, **sums, "stopped": ""}
        if not math.isnan(ev) and ev > best + config.min_delta:
            best, since_best = ev, 0
        else:
            since_best += 1
        if since_best >= config.patience:
            row["stopped"] = f"plateau: no explained-variance gain of {config.min_delta} in {config.patience} steps"
        elif step == config.max_steps:
            row["stopped"] = "max_steps"
        curve.append(row)
        if on_step:
            on_step(row)
        if row["stopped"]:
            break
    return curve


def value_stage(db: str | Path, model_dir: str | Path, out: str | Path, ppo: PPOConfig = PPOConfig(),
                config: ValuePretrainConfig = ValuePretrainConfig(), seed: int = 0,
                on_step: Callable[[dict], None] | None = None, device: str = "cpu") -> dict:
    """Pretrain a critic for the causal LM in `model_dir` on the judged rollouts of the store `db`;
    write OUT/critic/ (ValueModel.save) and OUT/value_curve.json; return a summary."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from cudagym.train.critic import ValueModel
    from cudagym.train.data import collate, tokenize_trajectory
    from cudagym.train.trajectories import load_trajectories

    trajectories = [t for t in load_trajectories(db) if t.reward is not None]
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    samples, skipped = [], Counter()
    for trajectory in trajectories:
        try:
            samples.append(tokenize_trajectory(trajectory, tokenizer))
        except ValueError as e:  # no model turn, or a template that cannot be masked (TemplateError)
            skipped[type(e).__name__] += 1
    if not samples:
        raise ValueError(f"no judged rollout with a model turn in {db}")
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    batch = collate(samples, pad_id).to(device)
    critic = ValueModel.from_policy(AutoModelForCausalLM.from_pretrained(model_dir)).to(device)
    optimizer = torch.optim.AdamW(critic.parameters(), lr=ppo.critic_lr, weight_decay=ppo.weight_decay)
    curve = pretrain_value(critic, batch, optimizer, ppo, config, generator=torch.Generator().manual_seed(seed),
                           on_step=on_step)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    critic.save(out / "critic")
    summary = {"rollouts": len(samples), "skipped": dict(skipped), "response_tokens": int(batch.response_mask.sum()),
               "tokens": int(batch.attention_mask.sum()),  # every sequence token, prompt and tool outputs too
               "steps": len(curve), "explained_variance": curve[-1]["explained_variance"],
               "best_explained_variance": max((r["explained_variance"] for r in curve if not math.isnan(r["explained_variance"])),
                                              default=math.nan),
               "stopped": curve[-1]["stopped"], "critic": str(out / "critic"), "curve": str(out / "value_curve.json")}
    (out / "value_curve.json").write_text(json.dumps({"summary": summary, "ppo": asdict(ppo), "config": asdict(config),
                                                      "model": str(model_dir), "db": str(db), "curve": curve}, indent=1))
    return summary
