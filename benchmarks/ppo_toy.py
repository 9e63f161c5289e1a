"""PPO learning a verifiable reward on CPU: cudagym.train.ppo on a tiny random transformers model.

The episode has the shape of an agent rollout, scaled down: a prompt, a first model turn of 4
tokens, a 2-token "tool output" written by the environment (response mask 0: the policy is not
trained on it and GAE skips it), a second model turn of 4 tokens. The tool output is `13, p` with p
drawn per episode: 14 asks for even tokens, 15 for odd ones. Reward 1 when at least 3 of the 4
first-turn tokens are even AND at least 3 of the 4 second-turn tokens have the parity the tool asked
for, else 0: a uniform policy earns it (5/16)^2 = 9.8% of the time, and full reward needs the policy
to read the tool output (in its context, never trained on) and the first turn's credit to cross it.
The policy is a randomly initialised LlamaForCausalLM (vocabulary 16, 2 layers, width 64) and the
critic a value head on a copy of its decoder (cudagym.train.critic). Each step samples a batch
with transformers' generate, then runs one `ppo.update` (GAE, whitened advantages, clipped policy
and value losses, 2 epochs of 2 mini-batches). Mean reward should climb from ~0.1 towards 1.

    python benchmarks/ppo_toy.py [--steps 100] [--lr 3e-4] [--batch 64] [--threads 1] [--seed 0]

Writes benchmarks/results/ppo_toy.json (per-step metrics) and ppo_toy.png; numbers are quoted in
benchmarks/NOTES.md. The learning rate (3e-4 for both) is the toy's, not the paper's 3e-6 / 6e-6 for
a pretrained 7B+ model: a random 16-token model barely moves in 100 steps at 3e-6.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from cudagym.train.critic import ValueModel  # noqa: E402
from cudagym.train.ppo import PPOBatch, PPOConfig, update  # noqa: E402

VOCAB = 16
PROMPT = [1]
TOOL_SAYS, EVEN, ODD = 13, 14, 15
TURN_TOKENS = 4
UNIFORM_REWARD = (5 / 16) ** 2


def reward_of(turn1: torch.Tensor, asked: torch.Tensor, turn2: torch.Tensor) -> torch.Tensor:
    """1 where >= 3 of 4 first-turn tokens are even and >= 3 of 4 second-turn tokens have the asked parity."""
    first_ok = (turn1 % 2 == 0).sum(-1) >= 3
    second_ok = (turn2 % 2 == (asked == ODD).long().unsqueeze(-1)).sum(-1) >= 3
    return (first_ok & second_ok).float()


def make_models(seed: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=32,
                         pad_token_id=0, bos_token_id=1, eos_token_id=None)
    policy = LlamaForCausalLM(config)
    policy.generation_config.eos_token_id = None
    return policy, ValueModel.from_policy(policy)


@torch.no_grad()
def rollout(policy, batch_size: int) -> tuple[PPOBatch, torch.Tensor]:
    """Sample `batch_size` episodes: turn 1, the tool output, turn 2. Returns the batch and rewards."""
    def generate(ids):
        return policy.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True, top_k=0, top_p=1.0,
                               temperature=1.0, max_new_tokens=TURN_TOKENS, min_new_tokens=TURN_TOKENS, pad_token_id=0)

    ids = generate(torch.tensor([PROMPT] * batch_size))
    turn1 = ids[:, -TURN_TOKENS:]
    asked = torch.where(torch.rand(batch_size) < 0.5, EVEN, ODD)
    ids = torch.cat([ids, torch.full((batch_size, 1), TOOL_SAYS), asked.unsqueeze(-1)], dim=1)
    ids = generate(ids)
    mask = torch.tensor([[1.0] * TURN_TOKENS + [0.0, 0.0] + [1.0] * TURN_TOKENS] * batch_size)
    rewards = reward_of(turn1, asked, ids[:, -TURN_TOKENS:])
    token_rewards = torch.zeros_like(mask)
    token_rewards[:, -1] = rewards  # the last model token
    return PPOBatch(ids, torch.ones_like(ids), mask, token_rewards), rewards


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--lr", type=float, default=3e-4, help="actor and critic learning rate (AdamW)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    config = replace(PPOConfig(), actor_lr=args.lr, critic_lr=args.lr, batch_size=args.batch,
                     mini_batch_size=args.batch // 2, micro_batch_size=args.batch // 2, epochs=2)
    policy, critic = make_models(args.seed)
    policy_opt = torch.optim.AdamW(policy.parameters(), lr=config.actor_lr, weight_decay=config.weight_decay)
    critic_opt = torch.optim.AdamW(critic.parameters(), lr=config.critic_lr, weight_decay=config.weight_decay)
    generator = torch.Generator().manual_seed(args.seed)

    history = []
    start = time.perf_counter()
    for step in range(1, args.steps + 1):
        t0 = time.perf_counter()
        batch, rewards = rollout(policy, args.batch)
        t1 = time.perf_counter()
        metrics = update(policy, critic, batch, policy_opt, critic_opt, config, generator=generator)
        t2 = time.perf_counter()
        row = {"step": step, "mean_reward": float(rewards.mean()), "rollout_s": t1 - t0, "update_s": t2 - t1, **metrics}
        history.append(row)
        print(f"step {step:3d}  reward {row['mean_reward']:.3f}  kl {row['approx_kl']:+.4f}  clipfrac {row['clipfrac']:.3f}"
              f"  vf_loss {row['vf_loss']:.4f}  ev {row['explained_variance']:+.3f}  entropy {row['entropy']:.3f}"
              f"  {t2 - t0:.2f} s", flush=True)
    wall_s = time.perf_counter() - start

    import matplotlib
    import transformers

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = {"machine": f"{platform.machine()}, {torch.get_num_threads()} torch thread(s)", "python": platform.python_version(),
            "torch": torch.__version__, "transformers": transformers.__version__, "wall_s": wall_s, "args": vars(args),
            "config": asdict(config)}
    (out / "ppo_toy.json").write_text(json.dumps({"meta": meta, "steps": history}, indent=1))

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    steps = [r["step"] for r in history]
    axes[0].plot(steps, [r["mean_reward"] for r in history], marker=".")
    axes[0].axhline(UNIFORM_REWARD, color="grey", linestyle=":", label=f"uniform policy ({UNIFORM_REWARD:.3f})")
    axes[0].set(title="mean reward per batch", xlabel="PPO step", ylim=(0, 1.05))
    axes[0].legend(loc="lower right")
    axes[1].plot(steps, [r["explained_variance"] for r in history], label="explained variance")
    axes[1].plot(steps, [r["vf_loss"] for r in history], label="value loss")
    # a batch whose rewards are all 1 has near-constant returns: explained variance is then meaningless
    axes[1].set(title="critic", xlabel="PPO step", ylim=(-1.0, 1.05))
    axes[1].legend()
    axes[2].plot(steps, [r["approx_kl"] for r in history], label="approx KL")
    axes[2].plot(steps, [r["clipfrac"] for r in history], label="clip fraction")
    axes[2].plot(steps, [r["entropy"] / 5 for r in history], label="entropy / 5")
    axes[2].set(title="policy", xlabel="PPO step")
    axes[2].legend()
    fig.suptitle(f"cudagym.train.ppo on a tiny random Llama (batch {args.batch}, 2 epochs, lr {args.lr:g}): "
                 "turn 1 even, turn 2 of the parity the tool output asks for")
    fig.tight_layout()
    fig.savefig(out / "ppo_toy.png", dpi=110)
    first = sum(r["mean_reward"] for r in history[:5]) / len(history[:5])
    last = sum(r["mean_reward"] for r in history[-5:]) / len(history[-5:])
    print(f"mean reward, first 5 steps {first:.3f}, last 5 steps {last:.3f}; {wall_s:.0f} s; {out / 'ppo_toy.png'}")


if __name__ == "__main__":
    main()
