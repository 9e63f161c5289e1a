"""Multi-turn PPO with a critic, on one screen: pure tensor functions, then `update()`.

Read top to bottom like cleanrl's ppo.py, but every piece is an importable function so that tests
can check it against hand-computed numbers (tests/train/test_ppo.py). Shapes: B sequences, R response
tokens. A response is the whole multi-turn episode after the prompt: model turns (response_mask 1)
interleaved with tool outputs and environment messages (response_mask 0), as verl's agent loops
produce it. The reward of an episode sits on its last model token (cudagym.train.data).

What we match in verl (read at commit b178a3c, 0.8.0.dev: verl/trainer/ppo/core_algos.py, and the
multi-turn tool agent loop `tool_agent`, verl/experimental/agent_loop/tool_agent_loop.py, which runs
tools such as verl/tools/search_tool.py: generated ids get response_mask 1, each tool response is
rendered with the chat template and appended with mask 0, the ids stay those sampled):
- GAE (`compute_gae_advantage_return`): the recursion runs backwards over every response token, but on
  a token with mask 0 it neither updates the running advantage nor the bootstrap value; both are
  carried through. So a model token just before a tool output bootstraps from the value of the first
  model token after it: the tool output is part of the environment's transition, not an action.
  Returns = advantages + values, advantages whitened over mask-1 tokens only. Identical here.
- Policy loss (`compute_policy_loss_vanilla`): ratio clipped to [1 - clip_low, 1 + clip_high]
  (DAPO's asymmetric "clip-higher"), dual clip at clip_ratio_c = 3 for negative advantages, log-ratio
  clamped to +-20, token-mean over the mini-batch. Identical.
- Value loss (`compute_value_loss`): 0.5 * max((v - R)^2, (clip(v, v_old +- c) - R)^2), token-mean.
- KL to a reference (`kl_penalty`): k1 = logp - logp_ref, k3 ("low_var_kl") = exp(d) - d - 1 with
  d = logp_ref - logp, clamped as verl does; used as a loss term (verl's use_kl_loss), off by default.
One difference: verl writes `reward_score` on the last response token whatever its mask; a reward on
a mask-0 token is dropped by the GAE above. We put it on the last *model* token (data.py), which is the
same token whenever the episode ends with a model turn (the usual case) and keeps the reward otherwise.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class PPOConfig:
    """PPO settings. Defaults: the CUDA Agent paper where it reports a number, else verl's defaults."""

    gamma: float = 1.0  # paper (GAE gamma = 1: episodic, reward only at the end)
    lam: float = 0.95  # paper (verl's algorithm.lam default is 1.0)
    clip_low: float = 0.2  # paper (verl actor.clip_ratio_low)
    clip_high: float = 0.28  # paper (verl actor.clip_ratio_high)
    dual_clip: float = 3.0  # verl actor.clip_ratio_c default; paper silent
    value_clip: float = 0.5  # verl critic.cliprange_value default; paper silent
    actor_lr: float = 3e-6  # paper
    critic_lr: float = 6e-6  # paper
    weight_decay: float = 0.01  # verl optim.weight_decay default (AdamW); paper silent
    batch_size: int = 1024  # paper: trajectories per PPO step (verl data.train_batch_size)
    mini_batch_size: int = 256  # verl ppo_mini_batch_size default: 4 optimizer steps per batch; paper silent
    micro_batch_size: int = 1  # sequences per forward pass (gradient accumulation); memory only
    epochs: int = 1  # verl ppo_epochs default; paper silent
    max_grad_norm: float = 1.0  # verl actor/critic grad_clip default; paper silent
    entropy_coef: float = 0.0  # verl entropy_coeff default: entropy is logged, not optimised
    kl_coef: float = 0.0  # verl use_kl_loss=false by default; paper silent. > 0 needs a reference
    kl_estimator: str = "k3"  # verl kl_loss_type default low_var_kl (= k3)
    whiten_advantages: bool = True  # verl whitens GAE advantages over the response mask
    temperature: float = 1.0  # sampling temperature: log-probs are taken of logits / temperature
    max_context_tokens: int = 131_072  # paper: 128k context (prompt + multi-turn response)

    def __post_init__(self) -> None:
        if not 0.0 <= self.gamma <= 1.0 or not 0.0 <= self.lam <= 1.0:
            raise ValueError(f"gamma and lam must be in [0, 1], got {self.gamma}, {self.lam}")
        if not 0.0 < self.clip_low < 1.0 or self.clip_high <= 0.0:
            raise ValueError(f"clip_low must be in (0, 1) and clip_high > 0, got {self.clip_low}, {self.clip_high}")
        if self.dual_clip <= 1.0:
            raise ValueError(f"dual_clip must be > 1, got {self.dual_clip}")
        if self.value_clip <= 0.0:
            raise ValueError(f"value_clip must be > 0, got {self.value_clip}")
        if min(self.batch_size, self.mini_batch_size, self.micro_batch_size, self.epochs) < 1:
            raise ValueError("batch_size, mini_batch_size, micro_batch_size and epochs must be >= 1")
        if self.batch_size % self.mini_batch_size or self.mini_batch_size % self.micro_batch_size:
            raise ValueError(
                f"batch_size ({self.batch_size}) must be a multiple of mini_batch_size ({self.mini_batch_size}),"
                f" and that of micro_batch_size ({self.micro_batch_size})"
            )
        if self.kl_estimator not in KL_ESTIMATORS:
            raise ValueError(f"kl_estimator must be one of {sorted(KL_ESTIMATORS)}, got {self.kl_estimator!r}")
        if min(self.actor_lr, self.critic_lr, self.temperature) <= 0.0 or self.kl_coef < 0.0:
            raise ValueError("learning rates and temperature must be > 0, kl_coef >= 0")


# --- masked statistics --------------------------------------------------------------------------


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (x * mask).sum() / mask.sum().clamp(min=1)


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """(x - mean) / std over mask-1 entries (unbiased variance, as verl); mask-0 entries are garbage."""
    mean = masked_mean(x, mask)
    n = mask.sum()
    var = ((x - mean) ** 2 * mask).sum() / (n - 1).clamp(min=1)
    return (x - mean) * torch.rsqrt(var + eps)


# --- advantages ---------------------------------------------------------------------------------

ADVANTAGE_ESTIMATORS: dict[str, Callable] = {}


def register_advantage(name: str):
    def wrap(fn):
        ADVANTAGE_ESTIMATORS[name] = fn
        return fn

    return wrap


@register_advantage("gae")
@torch.no_grad()
def compute_gae(
    token_rewards: torch.Tensor, values: torch.Tensor, response_mask: torch.Tensor, gamma: float, lam: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token-level GAE over a masked multi-turn response -> (advantages, returns), both (B, R), unwhitened.

    For model tokens t < t' (t' the next model token, tool tokens in between skipped):
        delta_t = r_t + gamma * V(t') - V(t),   A_t = delta_t + gamma * lam * A(t')
    with V and A of "after the last model token" = 0. Mask-0 positions carry A and V of the next model
    token (meaningless there; every loss masks them out).
    """
    mask = response_mask.to(values.dtype)
    next_value = torch.zeros_like(values[:, 0])
    next_advantage = torch.zeros_like(values[:, 0])
    advantages = torch.zeros_like(values)
    for t in reversed(range(values.shape[1])):
        delta = token_rewards[:, t] + gamma * next_value - values[:, t]
        advantage = delta + gamma * lam * next_advantage
        # a tool token leaves the running value and advantage as they were: it is skipped
        next_value = mask[:, t] * values[:, t] + (1 - mask[:, t]) * next_value
        next_advantage = mask[:, t] * advantage + (1 - mask[:, t]) * next_advantage
        advantages[:, t] = next_advantage
    return advantages, advantages + values


# --- losses -------------------------------------------------------------------------------------


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    clip_low: float,
    clip_high: float,
    dual_clip: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped surrogate, token-mean over the mask -> (loss, {clipfrac, approx_kl})."""
    log_ratio = (logprobs - old_logprobs).clamp(-20.0, 20.0)
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    losses = torch.maximum(unclipped, clipped)
    if dual_clip is not None:
        # dual clip: for A < 0 the loss is bounded by -A * c however large the ratio grows
        losses = torch.where(advantages < 0, torch.minimum(losses, -advantages * dual_clip), losses)
    stats = {
        "clipfrac": masked_mean((clipped > unclipped).float(), response_mask),
        # k1 estimate of KL(old || new) on the sampled tokens, as verl's ppo_kl and cleanrl's approx_kl
        "approx_kl": masked_mean(-log_ratio, response_mask),
    }
    return masked_mean(losses, response_mask), stats


def value_loss(
    values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, response_mask: torch.Tensor, value_clip: float
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """0.5 * max((v - R)^2, (v_clipped - R)^2), v_clipped within value_clip of the rollout's value."""
    clipped = old_values + (values - old_values).clamp(-value_clip, value_clip)
    loss_unclipped = (values - returns) ** 2
    loss_clipped = (clipped - returns) ** 2
    loss = 0.5 * masked_mean(torch.maximum(loss_unclipped, loss_clipped), response_mask)
    return loss, {"vf_clipfrac": masked_mean((loss_clipped > loss_unclipped).float(), response_mask)}


def _kl_k1(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    return logprobs - ref_logprobs


def _kl_k3(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    d = (ref_logprobs - logprobs).clamp(-20.0, 20.0)  # clamps as verl's low_var_kl
    return (torch.exp(d) - d - 1.0).clamp(-10.0, 10.0)


# Schulman, "Approximating KL divergence" (2020): estimators of KL(policy || reference) per sampled token
KL_ESTIMATORS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {"k1": _kl_k1, "k3": _kl_k3}


def kl_estimate(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: str = "k3") -> torch.Tensor:
    return KL_ESTIMATORS[estimator](logprobs, ref_logprobs)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Per-token entropy of the categorical distribution (B, R, V) -> (B, R)."""
    logp = F.log_softmax(logits.float(), dim=-1)
    return -(logp.exp() * logp).sum(-1)


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """log p(tokens) under logits (B, R, V), tokens (B, R) -> (B, R)."""
    return torch.gather(F.log_softmax(logits.float(), dim=-1), -1, tokens.unsqueeze(-1)).squeeze(-1)


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> float:
    """1 - Var(R - V) / Var(R) over mask-1 tokens; nan where the returns do not vary."""
    var_returns = masked_mean((returns - masked_mean(returns, mask)) ** 2, mask)
    residual = returns - values
    var_residual = masked_mean((residual - masked_mean(residual, mask)) ** 2, mask)
    return math.nan if var_returns.item() == 0.0 else float(1.0 - var_residual / var_returns)


# --- one PPO epoch over a batch for a transformers policy and a critic ---------------------------


@dataclass
class PPOBatch:
    """A padded batch: prompts left-padded to P columns, responses right-padded to R columns."""

    input_ids: torch.Tensor  # (B, P + R)
    attention_mask: torch.Tensor  # (B, P + R): 0 on padding
    response_mask: torch.Tensor  # (B, R): 1 model token, 0 tool/environment token or padding
    token_rewards: torch.Tensor  # (B, R): the episode reward on its last model token, else 0

    @property
    def response_length(self) -> int:
        return self.response_mask.shape[1]

    def select(self, index: torch.Tensor) -> PPOBatch:
        return PPOBatch(*(t[index] for t in (self.input_ids, self.attention_mask, self.response_mask, self.token_rewards)))

    def to(self, device: str | torch.device) -> PPOBatch:
        return PPOBatch(*(t.to(device) for t in (self.input_ids, self.attention_mask, self.response_mask, self.token_rewards)))


def _position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    # left padding: positions count real tokens only, as in generation
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def response_logits(policy: torch.nn.Module, batch: PPOBatch, temperature: float = 1.0) -> torch.Tensor:
    """Logits that predict each response token (B, R, V): the model's outputs one position earlier."""
    out = policy(input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=_position_ids(batch.attention_mask))
    r = batch.response_length
    return out.logits[:, -r - 1 : -1].float() / temperature


def response_values(critic: torch.nn.Module, batch: PPOBatch) -> torch.Tensor:
    """V(state before each response token) (B, R); the critic returns one value per position (B, T)."""
    values = critic(input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=_position_ids(batch.attention_mask))
    r = batch.response_length
    return values[:, -r - 1 : -1].float()


def in_micro_batches(fn: Callable[[PPOBatch], torch.Tensor], batch: PPOBatch, micro_batch_size: int) -> torch.Tensor:
    """fn over consecutive slices of `batch`, concatenated along the batch dimension."""
    n = batch.input_ids.shape[0]
    return torch.cat([fn(batch.select(torch.arange(i, min(i + micro_batch_size, n)))) for i in range(0, n, micro_batch_size)])


@torch.no_grad()
def rollout_logprobs(policy: torch.nn.Module, batch: PPOBatch, config: PPOConfig) -> torch.Tensor:
    """Log-probs of the sampled response tokens under `policy` (B, R), no gradient."""
    def logprobs(micro: PPOBatch) -> torch.Tensor:
        return token_logprobs(response_logits(policy, micro, config.temperature), micro.input_ids[:, -micro.response_length :])

    return in_micro_batches(logprobs, batch, config.micro_batch_size)


@torch.no_grad()
def rollout_values(critic: torch.nn.Module, batch: PPOBatch, config: PPOConfig) -> torch.Tensor:
    """The critic's values of the response positions (B, R), no gradient."""
    return in_micro_batches(lambda micro: response_values(critic, micro), batch, config.micro_batch_size)


def policy_step(policy: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: PPOBatch, mini: torch.Tensor,
                old_logprobs: torch.Tensor, advantages: torch.Tensor, config: PPOConfig,
                ref_logprobs: torch.Tensor | None = None) -> dict[str, float]:
    """One optimizer step of the policy on the rows `mini` of `batch`, gradients accumulated over
    micro-batches so that the loss is the token-mean over the whole mini-batch."""
    mask = batch.response_mask.float()
    tokens = batch.input_ids[:, -batch.response_length :]
    mini_tokens = mask[mini].sum().clamp(min=1)
    optimizer.zero_grad()
    stats = dict.fromkeys(("pg_loss", "entropy", "clipfrac", "approx_kl", "kl"), 0.0)
    for micro in mini.split(config.micro_batch_size):
        m = mask[micro]
        weight = float(m.sum() / mini_tokens)
        logits = response_logits(policy, batch.select(micro), config.temperature)
        logprobs = token_logprobs(logits, tokens[micro])
        pg, pg_stats = policy_loss(logprobs, old_logprobs[micro], advantages[micro], m, config.clip_low, config.clip_high,
                                   config.dual_clip)
        entropy = masked_mean(entropy_from_logits(logits), m)
        loss = pg - config.entropy_coef * entropy
        if ref_logprobs is not None:
            kl = masked_mean(kl_estimate(logprobs, ref_logprobs[micro], config.kl_estimator), m)
            loss = loss + config.kl_coef * kl
            stats["kl"] += weight * float(kl.detach())
        (loss * weight).backward()
        for key, value in (("pg_loss", pg), ("entropy", entropy), *pg_stats.items()):
            stats[key] += weight * float(value.detach())
    stats["policy_grad_norm"] = float(torch.nn.utils.clip_grad_norm_(policy.parameters(), config.max_grad_norm))
    optimizer.step()
    return stats


def critic_step(critic: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: PPOBatch, mini: torch.Tensor,
                old_values: torch.Tensor, returns: torch.Tensor, config: PPOConfig) -> dict[str, float]:
    """One optimizer step of the critic on the rows `mini` (clipped value loss, token-mean)."""
    mask = batch.response_mask.float()
    mini_tokens = mask[mini].sum().clamp(min=1)
    optimizer.zero_grad()
    stats = {"vf_loss": 0.0, "vf_clipfrac": 0.0}
    for micro in mini.split(config.micro_batch_size):
        m = mask[micro]
        weight = float(m.sum() / mini_tokens)
        vf, vf_stats = value_loss(response_values(critic, batch.select(micro)), old_values[micro], returns[micro], m,
                                  config.value_clip)
        (vf * weight).backward()
        stats["vf_loss"] += weight * float(vf.detach())
        stats["vf_clipfrac"] += weight * float(vf_stats["vf_clipfrac"])
    stats["critic_grad_norm"] = float(torch.nn.utils.clip_grad_norm_(critic.parameters(), config.max_grad_norm))
    optimizer.step()
    return stats


def update(
    policy: torch.nn.Module,
    critic: torch.nn.Module,
    batch: PPOBatch,
    policy_optimizer: torch.optim.Optimizer,
    critic_optimizer: torch.optim.Optimizer,
    config: PPOConfig,
    reference: torch.nn.Module | None = None,
    generator: torch.Generator | None = None,
) -> dict[str, float]:
    """config.epochs PPO epochs over `batch` (the rollout of the current policy); returns diagnostics.

    Log-probs and values of the rollout (no gradient), GAE, whitened advantages, then for each
    shuffled mini-batch one step of the policy and one of the critic.
    """
    n = batch.input_ids.shape[0]
    if config.kl_coef > 0 and reference is None:
        raise ValueError("kl_coef > 0 needs a reference policy")
    if n % config.mini_batch_size:
        raise ValueError(f"batch of {n} sequences is not a multiple of mini_batch_size {config.mini_batch_size}")
    mask = batch.response_mask.float()
    old_logprobs = rollout_logprobs(policy, batch, config)
    old_values = rollout_values(critic, batch, config)
    ref_logprobs = rollout_logprobs(reference, batch, config) if reference is not None and config.kl_coef > 0 else None
    advantages, returns = ADVANTAGE_ESTIMATORS["gae"](batch.token_rewards, old_values, mask, config.gamma, config.lam)
    if config.whiten_advantages:
        advantages = masked_whiten(advantages, mask)

    sums: dict[str, float] = {}
    steps = 0
    for _ in range(config.epochs):
        for mini in torch.randperm(n, generator=generator).split(config.mini_batch_size):
            stats = policy_step(policy, policy_optimizer, batch, mini, old_logprobs, advantages, config, ref_logprobs)
            stats.update(critic_step(critic, critic_optimizer, batch, mini, old_values, returns, config))
            for key, value in stats.items():
                sums[key] = sums.get(key, 0.0) + value
            steps += 1
    metrics = {key: value / steps for key, value in sums.items()}
    metrics["explained_variance"] = explained_variance(old_values, returns, mask)
    metrics["mean_return"] = float(masked_mean(returns, mask))
    metrics["response_tokens"] = float(mask.sum())
    return metrics
