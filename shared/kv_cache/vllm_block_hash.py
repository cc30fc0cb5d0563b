"""vLLM's `sha256_cbor` block hash, so that an indexer outside pdserve (llm-d's KV-cache
indexer, a GAIE endpoint picker) can compute the hashes an engine announces in its KV events.

A block's hash is SHA-256 over the canonical CBOR encoding of the array
(parent hash, block token ids, extra keys): the parent is the previous block's 32-byte digest,
or for the first block the seed digest (`none_hash`); the extra keys are an array of tagged
keys, each an array of its tag and value ("lora", then the adapter key; "cache_salt", then the
salt), or CBOR null when the block has none. The seed digest is SHA-256 over the canonical CBOR
of the `PYTHONHASHSEED` string, or of "vllm-none-hash" when the variable is unset, as vLLM
(0.32) derives its NONE_HASH for a cryptographic hash (docs/kubernetes.md).
"""

import hashlib
import os
from collections.abc import Sequence
from functools import cache

import cbor2

SEED_VARIABLE = "PYTHONHASHSEED"
DEFAULT_SEED = "vllm-none-hash"
LORA_TAG, SALT_TAG = "lora", "cache_salt"


def sha256_cbor(value: object) -> bytes:
    return hashlib.sha256(cbor2.dumps(value, canonical=True)).digest()


@cache
def none_hash(seed: str) -> bytes:
    """The parent digest of every prompt's first block, for this seed."""
    return sha256_cbor(seed)


def process_seed() -> str:
    return os.environ.get(SEED_VARIABLE, DEFAULT_SEED)


def hash_block_sha256_cbor(parent_hash: bytes | None, token_ids: Sequence[int],
                           extra_keys: Sequence[tuple[str, str]]) -> bytes:
    parent = parent_hash if parent_hash is not None else none_hash(process_seed())
    return sha256_cbor((parent, tuple(token_ids), tuple(extra_keys) if extra_keys else None))
