"""The local PPO engine: rollouts of the agent environment with the trainer's own policy, then `ppo.update`.

One machine, one process: the policy is served by the trainer itself. `PolicyServer` is the scripted
server's OpenAI-compatible HTTP endpoint (cudagym.agent.scripted.ScriptedServer: same routes, same
reply shape) whose replies come from `transformers` generate on the current policy instead of a
script; the agent loop's real `openai` client talks to it like to any server. Tool calls go in the
loop's text format (`<tool_call>` blocks), which any chat template can carry.

Per step k:
1. rollouts: `cudagym.agent.rollout.run_rollouts` on the task set into OUT/rollouts/step-k (the
   judge's milestone reward per rollout; a killed step's finished rollouts are kept and reused: they
   come from the same policy);
2. trajectories -> samples (data.tokenize_trajectory: response mask, reward on the last model token)
   -> one batch -> `ppo.update` (GAE over the masked response, clipped losses);
3. checkpoint OUT/checkpoints/step-k (policy + tokenizer, critic, optimizer states; written to a
   temporary folder and renamed, so a checkpoint is whole or absent), then one row in OUT/metrics.jsonl.
A run restarts from its last checkpoint: steps up to it are not redone, metrics rows of later
(unfinished) steps are dropped.
"""

from __future__ import annotations

import json
import math
import shutil
import threading
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch

from cudagym.agent.scripted import ScriptedServer
from cudagym.train.ppo import PPOConfig, update

METRICS = "metrics.jsonl"
POLICY_MODEL = "policy"  # the model name the loop's client sends


class PolicyServer(ScriptedServer):
    """An OpenAI-compatible /v1/chat/completions endpoint answering with `policy.generate`."""

    def __init__(self, policy, tokenizer, max_new_tokens: int = 256, temperature: float = 1.0):
        super().__init__(delay_s=0.0)
        self.policy, self.tokenizer = policy, tokenizer
        self.max_new_tokens, self.temperature = max_new_tokens, temperature
        self.generate_lock = threading.Lock()  # one generate at a time: the weights are shared with training
        self.completion_tokens = 0
        self.generate_s = 0.0

    def handle(self, handler, body: dict) -> None:
        from cudagym.train.data import _clean

        messages = _clean(body.get("messages") or [])
        prompt = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        ids = self.tokenizer(prompt, add_special_tokens=False, return_tensors="pt")["input_ids"].to(self.policy.device)
        max_new = min(self.max_new_tokens, int(body.get("max_tokens") or self.max_new_tokens))
        with self.generate_lock, torch.no_grad():
            t0 = time.perf_counter()
            self.policy.eval()
            out = self.policy.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True,
                                       temperature=self.temperature, top_k=0, max_new_tokens=max_new,
                                       eos_token_id=self.tokenizer.eos_token_id,
                                       pad_token_id=self.tokenizer.pad_token_id or self.tokenizer.eos_token_id)
            new = out[0, ids.shape[1]:].tolist()
            self.generate_s += time.perf_counter() - t0
            self.completion_tokens += len(new)
        stopped = bool(new) and new[-1] == self.tokenizer.eos_token_id
        text = self.tokenizer.decode(new[:-1] if stopped else new, skip_special_tokens=False)
        handler._send(200, {"id": "chatcmpl-policy", "object": "chat.completion", "created": int(time.time()),
                            "model": POLICY_MODEL,
                            "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                                         "finish_reason": "stop" if stopped else "length"}],
                            "usage": {"prompt_tokens": ids.shape[1], "completion_tokens": len(new),
                                      "total_tokens": ids.shape[1] + len(new)}})


@dataclass(frozen=True)
class LocalPPOConfig:
    tasks: str  # a task set (cudagym.tasks.load_task_set) or "kernelbench"
    model: str  # transformers checkpoint folder of the actor, with its tokenizer (e.g. the RFT checkpoint)
    out: str
    critic: str | None = None  # a ValueModel.save folder (value pretraining); None: a fresh critic from the actor
    steps: int = 1
    rollouts_per_step: int = 1  # samples per task per step
    levels: tuple[int, ...] | None = None
    ids: str | None = None
    max_turns: int = 150  # the paper's training rollouts
    max_new_tokens: int = 4096  # per model turn
    context_tokens: int = 32_768
    device: str = "cpu"  # where the judge runs
    policy_device: str = "cpu"  # where the policy and the critic generate and train
    seed: int = 0
    ppo: PPOConfig = field(default_factory=PPOConfig)

    def __post_init__(self) -> None:
        if self.steps < 1 or self.rollouts_per_step < 1 or self.max_new_tokens < 1:
            raise ValueError("steps, rollouts_per_step and max_new_tokens must be >= 1")
        if not (Path(self.model) / "config.json").is_file():
            raise ValueError(f"--model {self.model} is not a transformers checkpoint folder (no config.json)")


def last_checkpoint(out: Path) -> int:
    """The highest step with a whole checkpoint (0: none)."""
    steps = [int(p.name.removeprefix("step-")) for p in (out / "checkpoints").glob("step-*") if p.name[5:].isdigit()]
    return max(steps, default=0)


def _load(config: LocalPPOConfig, out: Path, start: int):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from cudagym.train.critic import ValueModel

    if start:
        folder = out / "checkpoints" / f"step-{start}"
        policy = AutoModelForCausalLM.from_pretrained(folder / "policy")
        tokenizer = AutoTokenizer.from_pretrained(folder / "policy")
        critic = ValueModel.load(folder / "critic")
    else:
        policy = AutoModelForCausalLM.from_pretrained(config.model)
        tokenizer = AutoTokenizer.from_pretrained(config.model)
        critic = ValueModel.load(config.critic) if config.critic else ValueModel.from_policy(policy)
    policy, critic = policy.to(config.policy_device), critic.to(config.policy_device)
    policy_opt = torch.optim.AdamW(policy.parameters(), lr=config.ppo.actor_lr, weight_decay=config.ppo.weight_decay)
    critic_opt = torch.optim.AdamW(critic.parameters(), lr=config.ppo.critic_lr, weight_decay=config.ppo.weight_decay)
    if start:
        states = torch.load(out / "checkpoints" / f"step-{start}" / "optimizers.pt", weights_only=True)
        policy_opt.load_state_dict(states["policy"])
        critic_opt.load_state_dict(states["critic"])
    return policy, tokenizer, critic, policy_opt, critic_opt


def _save(out: Path, step: int, policy, tokenizer, critic, policy_opt, critic_opt) -> Path:
    final = out / "checkpoints" / f"step-{step}"
    tmp = out / "checkpoints" / f".step-{step}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    policy.save_pretrained(tmp / "policy")
    tokenizer.save_pretrained(tmp / "policy")
    critic.save(tmp / "critic")
    torch.save({"policy": policy_opt.state_dict(), "critic": critic_opt.state_dict()}, tmp / "optimizers.pt")
    tmp.rename(final)
    return final


def _metrics_rows(out: Path, upto: int) -> list[dict]:
    """The metrics rows of steps up to `upto` (rows of a step killed after its row was written are dropped)."""
    path = out / METRICS
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []
    return [r for r in rows if r["step"] <= upto]


def run_ppo(config: LocalPPOConfig, progress=None) -> list[dict]:
    """Run PPO steps until `config.steps`, resuming after the last checkpoint; returns every step's metrics."""
    from cudagym.agent.rollout import RolloutConfig, run_rollouts
    from cudagym.train.data import collate, tokenize_trajectory
    from cudagym.train.trajectories import load_trajectories

    progress = progress or (lambda line: None)
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    start = last_checkpoint(out)
    rows = _metrics_rows(out, start)
    (out / METRICS).write_text("".join(json.dumps(r) + "\n" for r in rows))
    if start >= config.steps:
        return rows
    (out / "config.json").write_text(json.dumps(asdict(config), indent=1, default=str))
    policy, tokenizer, critic, policy_opt, critic_opt = _load(config, out, start)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    generator = torch.Generator().manual_seed(config.seed)
    for step in range(start + 1, config.steps + 1):
        torch.manual_seed(config.seed * 100_003 + step)  # sampling differs per step, reproducibly
        t0 = time.perf_counter()
        with PolicyServer(policy, tokenizer, config.max_new_tokens, config.ppo.temperature) as server:
            rollouts = RolloutConfig(tasks=config.tasks, out=str(out / "rollouts" / f"step-{step}"), model=POLICY_MODEL,
                                     base_url=server.base_url, levels=config.levels, ids=config.ids,
                                     n_samples=config.rollouts_per_step, parallel=1, max_turns=config.max_turns,
                                     device=config.device, temperature=config.ppo.temperature,
                                     max_tokens=config.max_new_tokens, context_tokens=config.context_tokens,
                                     tool_format="text", max_retries=0)
            summary = run_rollouts(rollouts)
            generated, generate_s = server.completion_tokens, server.generate_s
        rollout_s = time.perf_counter() - t0
        trajectories = [t for t in load_trajectories(summary["db"]) if t.reward is not None]
        samples = [tokenize_trajectory(t, tokenizer) for t in trajectories
                   if any(m.get("role") == "assistant" for m in t.messages)]
        if not samples:
            raise RuntimeError(f"step {step}: no judged rollout with a model turn in {summary['db']}")
        batch = collate(samples, pad_id).to(config.policy_device)
        n = len(samples)
        ppo = replace(config.ppo, batch_size=n, mini_batch_size=n, micro_batch_size=1)
        policy.train()
        t1 = time.perf_counter()
        stats = update(policy, critic, batch, policy_opt, critic_opt, ppo, generator=generator)
        update_s = time.perf_counter() - t1
        rewards = [s.reward for s in samples]
        row = {"step": step, "rollouts": n, "reward": sum(rewards) / n,
               "pass_rate": sum(r >= 1 for r in rewards) / n,  # milestone rewards: 1 correct, 2, 3 faster
               "faster_than_compile": sum(r >= 3 for r in rewards) / n,
               "kl": stats["approx_kl"], "clipfrac": stats["clipfrac"], "value_loss": stats["vf_loss"],
               "explained_variance": stats["explained_variance"], "pg_loss": stats["pg_loss"],
               "entropy": stats["entropy"], "response_tokens": stats["response_tokens"],
               "sequence_tokens": int(batch.attention_mask.sum()),  # what the update read: prompts, tool outputs too
               "generated_tokens": generated,
               "tokens_per_s": generated / generate_s if generate_s > 0 else math.nan,
               "rollout_s": rollout_s, "update_s": update_s}
        _save(out, step, policy, tokenizer, critic, policy_opt, critic_opt)
        with open(out / METRICS, "a") as f:
            f.write(json.dumps(row) + "\n")
        rows.append(row)
        progress(f"step {step}: reward {row['reward']:.2f}, pass rate {row['pass_rate']:.2f}, "
                 f"kl {row['kl']:.4f}, clipfrac {row['clipfrac']:.3f}, value loss {row['value_loss']:.4f}")
    return rows
