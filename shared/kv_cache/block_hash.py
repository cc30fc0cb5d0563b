"""Chained block hashes for prefix caching.

Block i's hash covers (block i-1's hash, block i's token ids, extra keys), so equal hashes
mean equal prefixes. Only full blocks are hashed. Extra keys carry what else changes the KV
for the same tokens: the model id, and an optional per-tenant salt that keeps tenants from
sharing (and probing) each other's cache entries.
"""

import hashlib
import struct
from collections.abc import Sequence

BlockHash = bytes

SUPPORTED_HASH_ALGOS = ("sha256", "blake2b")


def hash_block(
    parent_hash: BlockHash | None,
    token_ids: Sequence[int],
    extra_keys: Sequence[str] = (),
    algo: str = "sha256",
) -> BlockHash:
    hasher = hashlib.sha256() if algo == "sha256" else hashlib.blake2b(digest_size=32)
    hasher.update(parent_hash or b"\0" * 32)
    hasher.update(struct.pack(f"<I{len(token_ids)}I", len(token_ids), *token_ids))
    for key in extra_keys:
        encoded = key.encode()
        hasher.update(struct.pack("<I", len(encoded)) + encoded)
    return hasher.digest()


def hash_full_blocks(
    token_ids: Sequence[int],
    block_size: int,
    extra_keys: Sequence[str] = (),
    algo: str = "sha256",
    known_hashes: Sequence[BlockHash] = (),
) -> list[BlockHash]:
    """Hashes of every full block of `token_ids`, reusing `known_hashes` for the leading ones."""
    hashes = list(known_hashes)
    num_full_blocks = len(token_ids) // block_size
    for block_index in range(len(hashes), num_full_blocks):
        block_tokens = token_ids[block_index * block_size : (block_index + 1) * block_size]
        parent = hashes[-1] if hashes else None
        hashes.append(hash_block(parent, block_tokens, extra_keys, algo))
    return hashes
