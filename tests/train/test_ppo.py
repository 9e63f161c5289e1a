"""cudagym.train.ppo against numbers worked out by hand (each derivation in the test's comments)."""

from __future__ import annotations

import math

import pytest
import torch

from cudagym.train.ppo import (
    ADVANTAGE_ESTIMATORS,
    PPOConfig,
    compute_gae,
    entropy_from_logits,
    explained_variance,
    kl_estimate,
    masked_whiten,
    policy_loss,
    update,
    value_loss,
)

t = torch.tensor


# --- GAE ----------------------------------------------------------------------------------------

# one episode: model, model, tool, tool, model (reward 1 on the last model token), then padding.
# The critic's values on tool tokens and padding (9.0) must play no part.
MASK = t([[1.0, 1.0, 0.0, 0.0, 1.0, 0.0]])
VALUES = t([[0.5, 0.6, 9.0, 9.0, 0.8, 9.0]])
REWARDS = t([[0.0, 0.0, 0.0, 0.0, 1.0, 0.0]])


def test_gae_skips_tool_tokens_gamma_1():
    # gamma 1, lambda 0.5:
    # t4: delta = 1 + 0 - 0.8 = 0.2                     A4 = 0.2
    # t3, t2 (tool): skipped; t1 bootstraps from V(t4) = 0.8, not from 9.0
    # t1: delta = 0 + 0.8 - 0.6 = 0.2                   A1 = 0.2 + 0.5 * 0.2 = 0.3
    # t0: delta = 0 + 0.6 - 0.5 = 0.1                   A0 = 0.1 + 0.5 * 0.3 = 0.25
    adv, ret = compute_gae(REWARDS, VALUES, MASK, gamma=1.0, lam=0.5)
    model = MASK[0].bool()
    assert adv[0, model].tolist() == pytest.approx([0.25, 0.3, 0.2])
    assert ret[0, model].tolist() == pytest.approx([0.75, 0.9, 1.0])


def test_gae_discount_counts_model_tokens_only():
    # gamma 0.9, lambda 1: the return of a model token is 0.9^(model tokens after it) * reward
    # t4: A = 1 - 0.8 = 0.2; t1: delta = 0.9*0.8 - 0.6 = 0.12, A = 0.12 + 0.9*0.2 = 0.3;
    # t0: delta = 0.9*0.6 - 0.5 = 0.04, A = 0.04 + 0.9*0.3 = 0.31
    adv, ret = compute_gae(REWARDS, VALUES, MASK, gamma=0.9, lam=1.0)
    model = MASK[0].bool()
    assert adv[0, model].tolist() == pytest.approx([0.31, 0.3, 0.2])
    assert ret[0, model].tolist() == pytest.approx([0.81, 0.9, 1.0])


def test_gae_without_mask_would_differ():
    # the same tensors with every token counted as a model token: t1 bootstraps from the tool value 9.0
    adv, _ = compute_gae(REWARDS, VALUES, torch.ones_like(MASK), gamma=1.0, lam=0.5)
    assert adv[0, 1].item() != pytest.approx(0.3)
    assert "gae" in ADVANTAGE_ESTIMATORS


def test_gae_rows_are_independent():
    rewards = torch.cat([REWARDS, t([[0.0, 0.0, 0.0, 2.0, 0.0, 0.0]])])
    values = torch.cat([VALUES, torch.zeros(1, 6)])
    mask = torch.cat([MASK, t([[1.0, 1.0, 1.0, 1.0, 0.0, 0.0]])])
    adv, ret = compute_gae(rewards, values, mask, gamma=1.0, lam=0.95)
    assert adv[0, MASK[0].bool()].tolist() == pytest.approx(compute_gae(REWARDS, VALUES, MASK, 1.0, 0.95)[0][0, MASK[0].bool()].tolist())
    # row 2, zero values: delta is the reward at t3 only; A_t = 0.95^(3 - t) * 2
    assert adv[1, :4].tolist() == pytest.approx([2 * 0.95**3, 2 * 0.95**2, 2 * 0.95, 2.0])
    assert ret[1, :4].tolist() == pytest.approx([2 * 0.95**3, 2 * 0.95**2, 2 * 0.95, 2.0])


def test_whitening_uses_model_tokens_only():
    x = t([[1.0, 2.0, 100.0, 3.0]])
    mask = t([[1.0, 1.0, 0.0, 1.0]])
    w = masked_whiten(x, mask)
    # mean 2, unbiased variance ((1)^2 + 0 + 1^2) / 2 = 1
    assert w[0, [0, 1, 3]].tolist() == pytest.approx([-1.0, 0.0, 1.0], abs=1e-6)


# --- policy loss --------------------------------------------------------------------------------


def _policy_case():
    ratios = t([[1.5, 0.5, 1.1, 0.5, 7.0]])
    advantages = t([[1.0, -1.0, 2.0, 1.0, 5.0]])
    mask = t([[1.0, 1.0, 1.0, 1.0, 0.0]])  # the last token is a tool token: ignored whatever its numbers
    old = torch.zeros_like(ratios)
    return torch.log(ratios).requires_grad_(True), old, advantages, mask


def test_policy_loss_clips_both_sides():
    logprobs, old, advantages, mask = _policy_case()
    loss, stats = policy_loss(logprobs, old, advantages, mask, clip_low=0.2, clip_high=0.28)
    # token 0: r 1.5, A +1 -> high side: max(-1.5, -1.28) = -1.28 (clipped)
    # token 1: r 0.5, A -1 -> low side:  max(0.5, 0.8)   = 0.8   (clipped)
    # token 2: r 1.1, A +2 -> inside:    -2.2
    # token 3: r 0.5, A +1 -> max(-0.5, -0.8) = -0.5: below the range with A > 0 is not clipped (pessimistic)
    assert loss.item() == pytest.approx((-1.28 + 0.8 - 2.2 - 0.5) / 4)
    assert stats["clipfrac"].item() == pytest.approx(0.5)
    assert stats["approx_kl"].item() == pytest.approx(-(math.log(1.5) + math.log(0.5) + math.log(1.1) + math.log(0.5)) / 4)
    loss.backward()
    grad = logprobs.grad[0]
    # clipped tokens and the tool token get no gradient; d(-A r)/d logp = -A r / 4 for the others
    assert grad[[0, 1, 4]].tolist() == [0.0, 0.0, 0.0]
    assert grad[2].item() == pytest.approx(-2.0 * 1.1 / 4)
    assert grad[3].item() == pytest.approx(-1.0 * 0.5 / 4)


def test_policy_clipping_is_asymmetric():
    logprobs = torch.log(t([[1.25, 0.75]]))
    advantages = t([[1.0, -1.0]])
    mask = torch.ones(1, 2)
    loss, stats = policy_loss(logprobs, torch.zeros(1, 2), advantages, mask, clip_low=0.2, clip_high=0.28)
    # 1.25 is inside (1 - 0.2, 1 + 0.28): -1.25; 0.75 is under 0.8: max(0.75, 0.8) = 0.8 (clipped)
    assert loss.item() == pytest.approx((-1.25 + 0.8) / 2)
    assert stats["clipfrac"].item() == pytest.approx(0.5)
    loss_sym, stats_sym = policy_loss(logprobs, torch.zeros(1, 2), advantages, mask, clip_low=0.2, clip_high=0.2)
    assert loss_sym.item() == pytest.approx((-1.2 + 0.8) / 2)  # symmetric 0.2 clips 1.25 to 1.2
    assert stats_sym["clipfrac"].item() == pytest.approx(1.0)


def test_dual_clip_bounds_negative_advantages():
    logprobs = torch.log(t([[5.0]]))
    args = (torch.zeros(1, 1), t([[-1.0]]), torch.ones(1, 1))
    # r 5, A -1: max(5, 1.28) = 5; dual clip caps it at -A * 3 = 3
    assert policy_loss(logprobs, *args, clip_low=0.2, clip_high=0.28)[0].item() == pytest.approx(5.0)
    assert policy_loss(logprobs, *args, clip_low=0.2, clip_high=0.28, dual_clip=3.0)[0].item() == pytest.approx(3.0)


# --- value loss ---------------------------------------------------------------------------------


def test_value_loss_clips_to_the_rollout_value():
    old = torch.zeros(1, 5)
    new = t([[0.5, 0.1, -0.5, 0.5, 4.0]])
    returns = t([[1.0, 1.0, -1.0, 0.0, 0.0]])
    mask = t([[1.0, 1.0, 1.0, 1.0, 0.0]])
    loss, stats = value_loss(new, old, returns, mask, value_clip=0.2)
    # 0: v 0.5 clipped to 0.2: max(0.25, 0.64) = 0.64 (clipped)
    # 1: v 0.1 inside: 0.81 both
    # 2: v -0.5 clipped to -0.2: max(0.25, 0.64) = 0.64 (clipped)
    # 3: v 0.5 clipped to 0.2, return 0: max(0.25, 0.04) = 0.25
    assert loss.item() == pytest.approx(0.5 * (0.64 + 0.81 + 0.64 + 0.25) / 4)
    assert stats["vf_clipfrac"].item() == pytest.approx(0.5)


# --- KL, entropy, explained variance ------------------------------------------------------------


def test_kl_estimators():
    logprobs, ref = t([-1.0, -2.0]), t([-2.0, -2.0])
    assert kl_estimate(logprobs, ref, "k1").tolist() == pytest.approx([1.0, 0.0])
    # k3 with d = ref - logp = -1: e^-1 - (-1) - 1 = e^-1; d = 0: 0
    assert kl_estimate(logprobs, ref, "k3").tolist() == pytest.approx([math.exp(-1.0), 0.0])


def test_entropy_and_explained_variance():
    assert entropy_from_logits(torch.zeros(1, 1, 4)).item() == pytest.approx(math.log(4))
    assert entropy_from_logits(t([[[0.0, -1e9]]])).item() == pytest.approx(0.0, abs=1e-6)
    returns = t([[1.0, 2.0, 3.0, 50.0]])
    mask = t([[1.0, 1.0, 1.0, 0.0]])
    assert explained_variance(returns, returns, mask) == pytest.approx(1.0)
    assert explained_variance(torch.full_like(returns, 2.0), returns, mask) == pytest.approx(0.0)
    # residuals (0.5, 0, -0.5): var 1/6 against var(returns) 2/3 -> 1 - 1/4
    assert explained_variance(t([[0.5, 2.0, 3.5, 0.0]]), returns, mask) == pytest.approx(0.75)
    assert math.isnan(explained_variance(returns, torch.ones_like(returns), mask))


def test_config_defaults_and_checks():
    c = PPOConfig()
    assert (c.gamma, c.lam, c.clip_low, c.clip_high, c.actor_lr, c.critic_lr, c.batch_size) == (1.0, 0.95, 0.2, 0.28, 3e-6, 6e-6, 1024)
    for bad in ({"lam": 1.5}, {"clip_low": 1.0}, {"batch_size": 1000}, {"kl_estimator": "k9"}, {"dual_clip": 1.0}):
        with pytest.raises(ValueError):
            PPOConfig(**bad)


# --- update() on a tiny transformers model (fixtures tiny_models, toy_batch: tests/train/conftest.py)


def test_update_accumulates_micro_batches_exactly(tiny_models, toy_batch):
    # one mini-batch of 4 in one forward or in micro-batches of 1: the same token-mean loss, the same step
    results = []
    for micro in (4, 1):
        policy, critic = tiny_models()
        config = PPOConfig(batch_size=4, mini_batch_size=4, micro_batch_size=micro, actor_lr=1e-2, critic_lr=1e-2)
        opt_p = torch.optim.SGD(policy.parameters(), lr=config.actor_lr)
        opt_c = torch.optim.SGD(critic.parameters(), lr=config.critic_lr)
        metrics = update(policy, critic, toy_batch, opt_p, opt_c, config, generator=torch.Generator().manual_seed(0))
        results.append((torch.cat([p.flatten() for p in policy.parameters()]), torch.cat([p.flatten() for p in critic.parameters()]), metrics))
    (p4, c4, m4), (p1, c1, m1) = results
    assert torch.allclose(p4, p1, atol=1e-6) and torch.allclose(c4, c1, atol=1e-6)
    assert m4["pg_loss"] == pytest.approx(m1["pg_loss"], abs=1e-6)
    assert m4["vf_loss"] == pytest.approx(m1["vf_loss"], abs=1e-6)
    assert m4["response_tokens"] == 16.0


def test_update_raises_rewarded_sequences_and_fits_values(tiny_models, toy_batch):
    policy, critic = tiny_models()
    batch = toy_batch
    config = PPOConfig(batch_size=4, mini_batch_size=2, micro_batch_size=2, actor_lr=1e-2, critic_lr=1e-2, kl_coef=0.1)
    reference, _ = tiny_models()
    opt_p = torch.optim.Adam(policy.parameters(), lr=config.actor_lr)
    opt_c = torch.optim.Adam(critic.parameters(), lr=config.critic_lr)
    from cudagym.train.ppo import rollout_logprobs, rollout_values

    def seq_logprob(row):
        lp = rollout_logprobs(policy, batch, config)
        return float((lp * batch.response_mask)[row].sum())

    before_good, before_bad = seq_logprob(0), seq_logprob(3)
    values_before = rollout_values(critic, batch, config)
    assert torch.all(values_before == 0)  # the zero-initialised head
    for step in range(5):
        metrics = update(policy, critic, batch, opt_p, opt_c, config, reference=reference, generator=torch.Generator().manual_seed(step))
    assert seq_logprob(0) > before_good  # rewarded episode more likely
    assert seq_logprob(3) < before_bad  # punished episode less likely
    assert metrics["kl"] > 0.0
    assert set(metrics) >= {"pg_loss", "vf_loss", "entropy", "clipfrac", "approx_kl", "explained_variance", "vf_clipfrac"}
    # the critic moved toward the returns: value of the last model token of row 0 toward +1
    assert rollout_values(critic, batch, config)[0, 5] > 0.0


def test_update_needs_a_reference_for_kl(tiny_models, toy_batch):
    policy, critic = tiny_models()
    config = PPOConfig(batch_size=4, mini_batch_size=4, micro_batch_size=4, kl_coef=0.1)
    opt = torch.optim.SGD(policy.parameters(), lr=1e-3)
    with pytest.raises(ValueError, match="reference"):
        update(policy, critic, toy_batch, opt, opt, config)
