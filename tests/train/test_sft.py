"""cudagym.train.sft: the fine-tuning loss falls on model tokens only (hand-computed on a tiny model)."""

from __future__ import annotations

import pytest
import torch.nn.functional as F

from cudagym.train.sft import SFTConfig, sft_loss


def test_sft_loss_is_the_nll_of_the_mask_1_tokens(tiny_models, toy_batch):
    policy, _ = tiny_models()
    loss, n_tokens = sft_loss(policy, toy_batch)
    # by hand: each response token is predicted by the logits one position earlier; mask 0 (tool) tokens skipped
    logits = policy(input_ids=toy_batch.input_ids, attention_mask=toy_batch.attention_mask,
                    position_ids=(toy_batch.attention_mask.cumsum(-1) - 1).clamp(min=0)).logits
    r = toy_batch.response_length
    logp = F.log_softmax(logits[:, -r - 1:-1].float(), -1).gather(-1, toy_batch.input_ids[:, -r:, None]).squeeze(-1)
    mask = toy_batch.response_mask
    assert n_tokens == mask.sum() == 16
    assert loss.item() == pytest.approx(-(logp * mask).sum().item() / 16, rel=1e-5)
    # a tool token's own likelihood does not enter the loss
    assert loss.item() != pytest.approx(-logp.mean().item(), rel=1e-3)


def test_sft_config_checks():
    with pytest.raises(ValueError):
        SFTConfig(lr=0)
    with pytest.raises(ValueError):
        SFTConfig(epochs=0)
