"""RFT fine-tuning: supervised fine-tuning of a causal LM on selected rollouts, loss on model tokens only.

A plain torch loop over the `Sample`s of cudagym.train.data rather than TRL's SFTTrainer. Why: the loss
must fall on exactly the tokens the model sampled (response mask 1: its turns up to and including the
end-of-turn token), never on tool outputs or the template's role headers. data.py already computes that
mask for any prefix-stable template, including tool calls in the agent loop's text format. TRL's
`assistant_only_loss=True` instead needs a chat template with `{% generation %}` markers: TRL
(main at f2cd577, 1.10.0.dev0: trl/trainer/sft_trainer.py, `get_training_chat_template` in
trl/chat_template_utils.py) patches in such a template only for a list of known families (Qwen, Llama 3,
Gemma, Phi-3, ...). SmolLM2's template has no markers and is not on the list, so its assistant mask
would be empty (TRL then raises). The loop below is the same computation as `ppo.update`'s log-probs
(`response_logits`, `token_logprobs`), so SFT and PPO agree on which token is trained.

`finetune` is resumable at stage granularity: a finished stage (OUT/checkpoint with `sft_summary.json`)
is returned as it is, not redone.
"""

from __future__ import annotations

import json
import math
import random
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from cudagym.train.ppo import masked_mean, response_logits, token_logprobs

SUMMARY = "sft_summary.json"
METRICS = "sft_metrics.jsonl"
CHECKPOINT = "checkpoint"


@dataclass(frozen=True)
class SFTConfig:
    lr: float = 1e-5  # ours: a common full fine-tuning rate for a small instruct model; the paper gives none
    epochs: int = 2
    batch_size: int = 8  # rollouts per optimizer step (token-mean loss over the batch)
    max_grad_norm: float = 1.0
    weight_decay: float = 0.0
    seed: int = 0
    device: str = "cpu"  # where the model trains ("cuda" on a GPU machine)

    def __post_init__(self) -> None:
        if self.lr <= 0 or self.epochs < 1 or self.batch_size < 1 or self.max_grad_norm <= 0:
            raise ValueError("lr and max_grad_norm must be > 0, epochs and batch_size >= 1")


def sft_loss(policy: torch.nn.Module, batch) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean negative log-likelihood of the response tokens with mask 1 -> (loss, number of such tokens)."""
    mask = batch.response_mask.float()
    logprobs = token_logprobs(response_logits(policy, batch), batch.input_ids[:, -batch.response_length:])
    return -masked_mean(logprobs, mask), mask.sum()


def finetune(samples: list, model_dir: str | Path, out: str | Path, config: SFTConfig = SFTConfig(),
             on_step: Callable[[dict], None] | None = None) -> dict:
    """Fine-tune the causal LM in `model_dir` on `samples` (data.Sample); write OUT/checkpoint (model and
    tokenizer, save_pretrained), OUT/sft_metrics.jsonl (one row per optimizer step) and OUT/sft_summary.json.
    An OUT that already holds a summary is a finished stage: its summary is returned, nothing is trained."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from cudagym.train.data import collate

    out = Path(out)
    if (out / SUMMARY).is_file():
        return json.loads((out / SUMMARY).read_text())
    if not samples:
        raise ValueError("no samples to fine-tune on")
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(config.seed)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    policy = AutoModelForCausalLM.from_pretrained(model_dir).to(config.device)
    policy.train()
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    optimizer = torch.optim.AdamW(policy.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    order = list(range(len(samples)))
    rng = random.Random(config.seed)
    rows: list[dict] = []
    (out / METRICS).write_text("")  # an unfinished earlier attempt is started over: its rows would not match
    step = 0
    for epoch in range(1, config.epochs + 1):
        rng.shuffle(order)
        for start in range(0, len(order), config.batch_size):
            chunk = [samples[i] for i in order[start:start + config.batch_size]]
            t0 = time.perf_counter()
            optimizer.zero_grad()
            # one sequence per forward pass; each weighted by its share of the batch's model tokens
            total = sum(sum(s.response_mask) for s in chunk) or 1
            loss_sum = 0.0
            for sample in chunk:
                loss, n_tokens = sft_loss(policy, collate([sample], pad_id).to(config.device))
                weight = float(n_tokens) / total
                (loss * weight).backward()
                loss_sum += weight * float(loss.detach())
            grad_norm = float(torch.nn.utils.clip_grad_norm_(policy.parameters(), config.max_grad_norm))
            optimizer.step()
            step += 1
            row = {"step": step, "epoch": epoch, "loss": loss_sum, "grad_norm": grad_norm, "tokens": total,
                   "tokens_per_s": total / max(time.perf_counter() - t0, 1e-9)}
            rows.append(row)
            with open(out / METRICS, "a") as f:
                f.write(json.dumps(row) + "\n")
            if on_step:
                on_step(row)
    tmp = out / f".{CHECKPOINT}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    policy.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    shutil.rmtree(out / CHECKPOINT, ignore_errors=True)
    tmp.rename(out / CHECKPOINT)
    summary = {"samples": len(samples), "steps": step, "first_loss": rows[0]["loss"], "last_loss": rows[-1]["loss"],
               "model_tokens": sum(sum(s.response_mask) for s in samples), "checkpoint": str(out / CHECKPOINT),
               "metrics": str(out / METRICS), "base_model": str(model_dir), "config": asdict(config)}
    if not all(math.isfinite(r["loss"]) for r in rows):
        raise FloatingPointError(f"the loss became non-finite; see {out / METRICS}")
    (out / SUMMARY).write_text(json.dumps(summary, indent=1))  # written last: it marks the stage finished
    return summary


def rft_stage(db: str | Path, model_dir: str | Path, out: str | Path, rft_config=None, config: SFTConfig = SFTConfig(),
              on_step: Callable[[dict], None] | None = None) -> dict:
    """The whole RFT stage: select rollouts of the store `db` (rft.RFTSelect), write them as a dataset
    (OUT/README.md + parquet, once), tokenize them with the model's chat template and fine-tune (`finetune`).
    Resumable: the dataset is written once, a finished fine-tuning is not redone."""
    from transformers import AutoTokenizer

    from cudagym.train.data import tokenize_trajectory
    from cudagym.train.rft import PARQUET_PATH, RFTConfig, RFTSelect, write_dataset
    from cudagym.train.trajectories import load_trajectories

    out = Path(out)
    rft_config = rft_config or RFTConfig()
    step = RFTSelect(rft_config)
    kept = list(step.run(load_trajectories(db)))  # deterministic: a rerun selects the same set
    if not (out / PARQUET_PATH).is_file():
        write_dataset(kept, out, step.stats, rft_config)
    if not kept:
        raise ValueError(f"no rollout of {db} passed the RFT selection ({dict(step.stats)}); nothing to fine-tune on")
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    samples = [tokenize_trajectory(t, tokenizer) for t in kept]
    summary = finetune(samples, model_dir, out, config, on_step=on_step)
    return {**summary, "selection": dict(step.stats)}
