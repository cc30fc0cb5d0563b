"""Fixtures shared by the end-to-end tests that use the real SmolLM2-135M-Instruct model."""

from pathlib import Path

import pytest

from shared.model.default_model import resolve_model


@pytest.fixture(scope="session")
def smollm2_folder() -> Path:
    """The converted SmolLM2-135M-Instruct HF folder (config, float32 safetensors, tokenizer).

    Cached in `$PDSERVE_CACHE_DIR` if set, else `~/.cache/pdserve`; the first run of a fresh
    cache converts the GGUF (about 10 s), later runs reuse it.
    """
    return resolve_model(None)
