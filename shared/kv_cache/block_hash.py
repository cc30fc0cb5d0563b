"""Chained block hashes for prefix caching: the one recipe that engines and gateways share.

Block i's hash covers (block i-1's hash, block i's token ids, extra keys), so equal hashes
mean equal prefixes. Only full blocks are hashed. Extra keys carry what else changes the KV
for the same tokens: the model id, and an optional per-tenant salt that keeps tenants from
sharing (and probing) each other's cache entries, and the LoRA adapter (if any) the KV was
computed with.

`prompt_block_hashes` is what every process calls: an engine to find and cache its blocks, a
gateway (with the recipe an instance registered in Redis) to ask the prefix index which
instance holds a prompt. Both get the same hashes only with the same HashRecipe.
"""

import hashlib
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from shared.errors import InvalidRequestError

BlockHash = bytes

DIGEST_NUM_BYTES = 32
_HASHERS: dict[str, Callable] = {
    "sha256": hashlib.sha256,
    "blake2b": lambda: hashlib.blake2b(digest_size=DIGEST_NUM_BYTES),
}
SUPPORTED_HASH_ALGOS = tuple(_HASHERS)


def check_hash_algo(algo: object) -> str:
    """Return `algo` if it is a supported prefix hash algorithm; raise InvalidRequestError."""
    if algo not in _HASHERS:
        raise InvalidRequestError("prefix_hash_algo", f"must be one of {SUPPORTED_HASH_ALGOS}, got {algo!r}")
    return algo


@dataclass(frozen=True)
class HashRecipe:
    """Everything besides the tokens (and salt) that a prompt's block hashes depend on."""

    model_id: str  # first extra key of every block
    block_size: int  # tokens per block
    algo: str = "sha256"

    def __post_init__(self) -> None:
        if not isinstance(self.model_id, str):
            raise InvalidRequestError("model_id", f"must be a string, got {self.model_id!r}")
        if isinstance(self.block_size, bool) or not isinstance(self.block_size, int) or self.block_size < 1:
            raise InvalidRequestError("block_size", f"must be an int >= 1, got {self.block_size!r}")
        check_hash_algo(self.algo)


def prompt_block_hashes(token_ids: Sequence[int], recipe: HashRecipe, cache_salt: str | None = None,
                        known_hashes: Sequence[BlockHash] = (), adapter_key: str | None = None) -> list[BlockHash]:
    """Hashes of every full block of a prompt (or a request's tokens so far), reusing
    `known_hashes` for the leading ones. `adapter_key`: the LoRA adapter the KV is computed
    with (shared.lora.registry), None for the base model."""
    extra_keys = (recipe.model_id,) + ((cache_salt,) if cache_salt else ()) + ((adapter_key,) if adapter_key else ())
    return hash_full_blocks(token_ids, recipe.block_size, extra_keys, recipe.algo, known_hashes)


def hash_block(
    parent_hash: BlockHash | None,
    token_ids: Sequence[int],
    extra_keys: Sequence[str] = (),
    algo: str = "sha256",
) -> BlockHash:
    hasher = _HASHERS[check_hash_algo(algo)]()
    hasher.update(parent_hash or b"\0" * DIGEST_NUM_BYTES)
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
