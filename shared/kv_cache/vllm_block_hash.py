"""vLLM's `sha256_cbor` block hash, so that an indexer outside pdserve (llm-d's KV-cache
indexer, a GAIE endpoint picker) can compute the hashes an engine announces in its KV events.

A block's hash is SHA-256 over the canonical CBOR encoding of the array
(parent hash, block token ids, extra keys): the parent is the previous block's 32-byte digest,
or for the first block the seed digest (`none_hash`); the extra keys are an array of strings, or
CBOR null when the block has none. The seed is SHA-256 over the canonical CBOR of the
`PYTHONHASHSEED` string, as vLLM derives its NONE_HASH. vLLM draws 32 random bytes when the
variable is unset, which nobody else can reproduce; pdserve's gateways and engines must agree,
so an unset variable counts as the empty string here (docs/kubernetes.md).
"""

import hashlib
import os
from collections.abc import Sequence
from functools import cache

import cbor2

SEED_VARIABLE = "PYTHONHASHSEED"


def sha256_cbor(value: object) -> bytes:
    return hashlib.sha256(cbor2.dumps(value, canonical=True)).digest()


@cache
def none_hash(seed: str) -> bytes:
    """The parent digest of every prompt's first block, for this seed."""
    return sha256_cbor(seed)


def process_seed() -> str:
    return os.environ.get(SEED_VARIABLE, "")


def hash_block_sha256_cbor(parent_hash: bytes | None, token_ids: Sequence[int], extra_keys: Sequence[str]) -> bytes:
    parent = parent_hash if parent_hash is not None else none_hash(process_seed())
    return sha256_cbor((parent, tuple(token_ids), tuple(extra_keys) if extra_keys else None))
