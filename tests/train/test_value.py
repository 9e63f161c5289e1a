"""cudagym.train.value: the critic fitted to GAE returns on fixed trajectories until its explained
variance plateaus (fixtures tiny_models, toy_batch: tests/train/conftest.py)."""

from __future__ import annotations

import pytest
import torch

from cudagym.train.ppo import PPOConfig, rollout_logprobs, rollout_values
from cudagym.train.value import ValuePretrainConfig, pretrain_value

PPO = PPOConfig(batch_size=4, mini_batch_size=2, micro_batch_size=2)


def test_value_pretraining_fits_the_returns_and_leaves_the_policy_alone(tiny_models, toy_batch):
    policy, critic = tiny_models()
    before_policy = rollout_logprobs(policy, toy_batch, PPO)
    optimizer = torch.optim.Adam(critic.parameters(), lr=1e-2)
    seen = []
    curve = pretrain_value(critic, toy_batch, optimizer, PPO, ValuePretrainConfig(max_steps=60, patience=5),
                           generator=torch.Generator().manual_seed(0), on_step=seen.append)
    assert seen == curve and [row["step"] for row in curve] == list(range(1, len(curve) + 1))
    # a zero critic explains none of the variance; after fitting, most of it
    assert curve[0]["explained_variance"] == pytest.approx(0.0, abs=1e-6)
    assert max(row["explained_variance"] for row in curve) > 0.8
    assert curve[-1]["stopped"] and all(not row["stopped"] for row in curve[:-1])
    values = rollout_values(critic, toy_batch, PPO)
    # the last model token of a +1 episode is valued near +1, of a -1 episode near -1
    assert values[0, 5] > 0.5 and values[3, 5] < -0.5
    assert torch.equal(rollout_logprobs(policy, toy_batch, PPO), before_policy)  # the actor is frozen


def test_value_pretraining_stops_on_a_plateau(tiny_models, toy_batch):
    _, critic = tiny_models()
    frozen = torch.optim.SGD(critic.parameters(), lr=0.0)  # nothing can improve: stop after `patience` steps
    curve = pretrain_value(critic, toy_batch, frozen, PPO, ValuePretrainConfig(max_steps=50, patience=3))
    # step 1 sets the best (0.0 > -inf), steps 2-4 gain nothing
    assert len(curve) == 4 and curve[-1]["stopped"].startswith("plateau")
    limited = pretrain_value(critic, toy_batch, frozen, PPO, ValuePretrainConfig(max_steps=2, patience=3))
    assert [row["stopped"] for row in limited] == ["", "max_steps"]


def test_config_checks():
    for bad in ({"max_steps": 0}, {"patience": 0}, {"min_delta": -1.0}):
        with pytest.raises(ValueError):
            ValuePretrainConfig(**bad)
