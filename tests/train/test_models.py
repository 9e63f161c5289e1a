"""models.save_random_model: SmolLM2-135M's architecture (checked against the GGUF file's metadata), random weights."""

from __future__ import annotations

import torch


def test_smollm2_config_matches_the_gguf_metadata():
    from transformers import AutoConfig

    from cudagym.train.models import SMOLLM2_135M_CONFIG, SMOLLM2_GGUF, smollm2_dir

    try:
        gguf = AutoConfig.from_pretrained(smollm2_dir(), gguf_file=SMOLLM2_GGUF).to_dict()
    except FileNotFoundError as e:
        import pytest

        pytest.skip(str(e))
    for key, value in SMOLLM2_135M_CONFIG.items():
        expected = gguf[key]
        assert (abs(value - expected) < 1e-9 if isinstance(value, float) else value == expected), key


def test_save_random_model_is_seeded_and_loadable(smollm2_tokenizer, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from cudagym.train.models import save_random_model

    small = {"num_hidden_layers": 1, "hidden_size": 16, "intermediate_size": 32, "num_attention_heads": 2,
             "num_key_value_heads": 1, "head_dim": 8}
    a = save_random_model(tmp_path / "a", smollm2_tokenizer, seed=3, **small)
    b = save_random_model(tmp_path / "b", smollm2_tokenizer, seed=3, **small)
    model_a, model_b = AutoModelForCausalLM.from_pretrained(a), AutoModelForCausalLM.from_pretrained(b)
    assert model_a.config.vocab_size == 49152 and model_a.config.tie_word_embeddings
    assert all(torch.equal(x, y) for x, y in zip(model_a.state_dict().values(), model_b.state_dict().values()))
    assert AutoTokenizer.from_pretrained(a).chat_template == smollm2_tokenizer.chat_template
