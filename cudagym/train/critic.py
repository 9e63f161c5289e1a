"""The critic: a value head on the actor's architecture, one scalar per position.

verl's critic is the actor's checkpoint loaded as AutoModelForTokenClassification with one label;
the same idea here without the class lookup: the policy's decoder (`base_model`, e.g. LlamaModel
inside LlamaForCausalLM), copied, and a linear head on its last hidden state. The head starts at
zero so that a fresh critic predicts 0 everywhere until value pretraining fits it.
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch
from torch import nn

HEAD_FILE = "value_head.pt"


class ValueModel(nn.Module):
    """V(prefix) for every position of a sequence: forward(input_ids, ...) -> (B, T) float values."""

    def __init__(self, backbone: nn.Module, hidden_size: int):
        super().__init__()
        self.backbone = backbone
        self.head = nn.Linear(hidden_size, 1)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    @classmethod
    def from_policy(cls, policy: nn.Module) -> ValueModel:
        """A critic whose backbone starts as a copy of a transformers causal LM's decoder."""
        return cls(copy.deepcopy(policy.base_model), policy.config.hidden_size)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None) -> torch.Tensor:
        hidden = self.backbone(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids).last_hidden_state
        return self.head(hidden.to(self.head.weight.dtype)).squeeze(-1)

    def save(self, folder: str | Path) -> Path:
        """The backbone as a transformers checkpoint (save_pretrained) plus `value_head.pt`."""
        folder = Path(folder)
        self.backbone.save_pretrained(folder)
        torch.save(self.head.state_dict(), folder / HEAD_FILE)
        return folder

    @classmethod
    def load(cls, folder: str | Path) -> ValueModel:
        from transformers import AutoModel

        folder = Path(folder)
        if not (folder / HEAD_FILE).is_file():
            raise FileNotFoundError(f"{folder} is not a saved critic (no {HEAD_FILE})")
        backbone = AutoModel.from_pretrained(folder)
        critic = cls(backbone, backbone.config.hidden_size)
        critic.head.load_state_dict(torch.load(folder / HEAD_FILE, weights_only=True))
        return critic
