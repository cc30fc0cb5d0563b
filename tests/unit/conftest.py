"""Fixtures shared by the unit tests: tiny random-weight Llama checkpoints in HF format."""

from pathlib import Path

import pytest
import torch

from shared.kv_transfer.ucx.lifecycle import reset_ucx
from transformers import LlamaConfig
from transformers import LlamaForCausalLM as HFLlamaForCausalLM

TINY_LLAMA = dict(
    vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
    rms_norm_eps=1e-5, rope_theta=10000.0, bos_token_id=1, eos_token_id=2,
    # Larger than HF's default 0.02 so attention is far from uniform and logits far from ties:
    # a wrong position, mask or cache slot then changes the numbers visibly.
    initializer_range=0.15,
)


def save_tiny_llama(folder: Path, tie_word_embeddings: bool, seed: int = 0) -> Path:
    """A 2-layer, hidden-64, 4-head (2 KV heads), vocab-256 Llama saved with save_pretrained."""
    config = LlamaConfig(**TINY_LLAMA, tie_word_embeddings=tie_word_embeddings)
    torch.manual_seed(seed)
    model = HFLlamaForCausalLM(config).eval()
    model.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def tiny_llama_folder(tmp_path_factory) -> Path:
    """HF folder (config.json + model.safetensors, float32) of a tiny Llama with tied embeddings."""
    return save_tiny_llama(tmp_path_factory.mktemp("tiny_llama"), tie_word_embeddings=True)


@pytest.fixture(scope="session")
def tiny_llama_untied_folder(tmp_path_factory) -> Path:
    """Like `tiny_llama_folder`, with a separate `lm_head.weight`."""
    return save_tiny_llama(tmp_path_factory.mktemp("tiny_llama_untied"), tie_word_embeddings=False, seed=1)


# A unit test that hangs fails after this long (pytest-timeout, thread method: it prints every
# thread's stack, then ends the run) instead of stalling CI. The whole-run default is longer.
UNIT_TEST_TIMEOUT_S = 300


def pytest_collection_modifyitems(items):
    for item in items:
        if item.get_closest_marker("timeout") is None and "tests/unit/" in item.nodeid.replace("\\", "/"):
            item.add_marker(pytest.mark.timeout(UNIT_TEST_TIMEOUT_S))


@pytest.fixture(autouse=True)
def ucx_per_test():
    """Every unit test starts and ends without a ucxx context, whichever module it is in.

    ucxx keeps one context per process, and its notifier thread serves the event loop that
    created it; each test's asyncio.run makes a new loop. So a context left by any test (one
    that used UCX through instance services, KVSender/KVReceiver, ...) is torn down before
    the next test and after this one. No-op (and no ucxx import) when none exists.
    """
    reset_ucx()
    yield
    reset_ucx()
