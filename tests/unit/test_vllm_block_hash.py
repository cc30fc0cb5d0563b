"""--prefix-hash-algo sha256_cbor hashes blocks as vLLM does, so an indexer outside pdserve can
reproduce them: known vectors built here byte by byte from the CBOR rules (RFC 8949, canonical
form) and from cbor2 directly, never through pdserve's hashing code."""

import hashlib

import cbor2
import pytest

from shared.kv_cache.block_hash import HashRecipe, block_extra_keys, hash_block, prompt_block_hashes


def sha256(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def vllm_hash(parent: bytes, tokens: list[int], extra_keys: tuple | None) -> bytes:
    """vLLM's sha256_cbor((parent, tokens, extra_keys)), straight from cbor2 and hashlib."""
    return sha256(cbor2.dumps((parent, tuple(tokens), extra_keys), canonical=True))


@pytest.fixture
def seed_zero(monkeypatch):
    monkeypatch.setenv("PYTHONHASHSEED", "0")
    return sha256(b"\x61\x30")  # NONE_HASH: the text string "0" (major type 3, length 1)


def test_the_first_block_chains_on_the_seed_digest_known_bytes(seed_zero):
    # array(3) [bytes(32) seed, array(3) [1, 2, 1000], null]
    payload = b"\x83" + b"\x58\x20" + seed_zero + b"\x83\x01\x02\x19\x03\xe8" + b"\xf6"
    assert hash_block(None, [1, 2, 1000], (), "sha256_cbor") == sha256(payload)


def test_extra_keys_are_an_array_of_tagged_keys_known_bytes(seed_zero):
    parent = bytes(range(32))
    # array(1) [array(2) ["lora", "abc"]]
    payload = b"\x83\x58\x20" + parent + b"\x82\x05\x06" + b"\x81\x82\x64lora\x63abc"
    assert hash_block(parent, [5, 6], (("lora", "abc"),), "sha256_cbor") == sha256(payload)


def test_an_unset_seed_is_vllms_default_seed(monkeypatch):
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    seed = b"\x6e" + b"vllm-none-hash"  # text string of length 14
    payload = b"\x83\x58\x20" + sha256(seed) + b"\x81\x07\xf6"
    assert hash_block(None, [7], (), "sha256_cbor") == sha256(payload)


def test_a_prompt_chains_like_vllm_without_the_model_id(seed_zero):
    tokens = list(range(100, 140))
    hashes = prompt_block_hashes(tokens, HashRecipe("any-model", 16, "sha256_cbor"))
    first = vllm_hash(seed_zero, tokens[:16], None)
    assert hashes == [first, vllm_hash(first, tokens[16:32], None)]
    assert prompt_block_hashes(tokens, HashRecipe("other-model", 16, "sha256_cbor")) == hashes


def test_the_adapter_key_goes_in_every_block_and_the_salt_in_the_first_only(seed_zero):
    tokens = list(range(32))
    recipe = HashRecipe("m", 16, "sha256_cbor")
    hashes = prompt_block_hashes(tokens, recipe, cache_salt="tenant", adapter_key="lora:a:k")
    first = vllm_hash(seed_zero, tokens[:16], (("lora", "lora:a:k"), ("cache_salt", "tenant")))
    assert hashes == [first, vllm_hash(first, tokens[16:], (("lora", "lora:a:k"),))]
    assert block_extra_keys(recipe, 0, "tenant", "lora:a:k") == ("lora:a:k", "tenant")
    assert block_extra_keys(recipe, 1, "tenant", "lora:a:k") == ("lora:a:k",)


def test_pdserves_own_algorithms_keep_their_keys_in_every_block():
    recipe = HashRecipe("m", 16)
    assert block_extra_keys(recipe, 0, "tenant", "lora:a:k") == ("m", "tenant", "lora:a:k")
    assert block_extra_keys(recipe, 3, "tenant") == ("m", "tenant")
