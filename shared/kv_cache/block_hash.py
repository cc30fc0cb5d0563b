"""Chained block hashes for prefix caching: the one recipe that engines and gateways share.

Block i's hash covers (block i-1's hash, block i's token ids, extra keys), so equal hashes
mean equal prefixes. Only full blocks are hashed. Extra keys carry what else changes the KV
for the same tokens: the model id, and an optional per-tenant salt that keeps tenants from
sharing (and probing) each other's cache entries, and the LoRA adapter (if any) the KV was
computed with.

`prompt_block_hashes` is what every process calls: an engine to find and cache its blocks, a
gateway (with the recipe an instance registered in Redis) to ask the prefix index which
instance holds a prompt. Both get the same hashes only with the same HashRecipe.

The algorithm decides how one block is hashed, and which extra keys it gets. "sha256" and
"blake2b" hash pdserve's own byte layout with the model id, salt and adapter key in every
block. "sha256_cbor" is vLLM's scheme (shared.kv_cache.vllm_block_hash), with vLLM's tagged keys:
the adapter key in every block, the salt in the first block only, and no model id, so that an
indexer outside pdserve can reproduce the hashes from the token ids (docs/kubernetes.md).
"""

import hashlib
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from shared.errors import InvalidRequestError
from shared.kv_cache.vllm_block_hash import LORA_TAG, SALT_TAG, hash_block_sha256_cbor

BlockHash = bytes

DIGEST_NUM_BYTES = 32
_HASHERS: dict[str, Callable] = {
    "sha256": hashlib.sha256,
    "blake2b": lambda: hashlib.blake2b(digest_size=DIGEST_NUM_BYTES),
}
# Algorithms that hash blocks as vLLM does (keys as vLLM orders them, no model id).
VLLM_HASH_ALGOS = ("sha256_cbor",)
SUPPORTED_HASH_ALGOS = (*_HASHERS, *VLLM_HASH_ALGOS)


def check_hash_algo(algo: object) -> str:
    """Return `algo` if it is a supported prefix hash algorithm; raise InvalidRequestError."""
    if algo not in SUPPORTED_HASH_ALGOS:
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
    keys, first_block_keys = _extra_keys(recipe, cache_salt, adapter_key)
    return hash_full_blocks(token_ids, recipe.block_size, keys, recipe.algo, known_hashes, first_block_keys)


def block_extra_keys(recipe: HashRecipe, block_index: int, cache_salt: str | None = None,
                     adapter_key: str | None = None) -> tuple[str, ...]:
    """The extra keys block `block_index` of a prompt is hashed with, untagged (as KV events
    carry them)."""
    keys, first_block_keys = _extra_keys(recipe, cache_salt, adapter_key)
    keys = keys + first_block_keys if block_index == 0 else keys
    return tuple(key[1] for key in keys) if recipe.algo in VLLM_HASH_ALGOS else keys


def _extra_keys(recipe: HashRecipe, cache_salt: str | None, adapter_key: str | None) -> tuple[tuple, tuple]:
    """(keys of every block, keys the first block adds), in the algorithm's order and form."""
    if recipe.algo in VLLM_HASH_ALGOS:
        return (((LORA_TAG, adapter_key),) if adapter_key else (),
                ((SALT_TAG, cache_salt),) if cache_salt else ())
    salt = (cache_salt,) if cache_salt else ()
    adapter = (adapter_key,) if adapter_key else ()
    return (recipe.model_id,) + salt + adapter, ()


def hash_block(
    parent_hash: BlockHash | None,
    token_ids: Sequence[int],
    extra_keys: Sequence[str] = (),
    algo: str = "sha256",
) -> BlockHash:
    if check_hash_algo(algo) in VLLM_HASH_ALGOS:
        return hash_block_sha256_cbor(parent_hash, token_ids, extra_keys)
    hasher = _HASHERS[algo]()
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
    first_block_keys: Sequence[str] = (),
) -> list[BlockHash]:
    """Hashes of every full block of `token_ids`, reusing `known_hashes` for the leading ones;
    the first block is hashed with `first_block_keys` after `extra_keys`."""
    hashes = list(known_hashes)
    num_full_blocks = len(token_ids) // block_size
    for block_index in range(len(hashes), num_full_blocks):
        block_tokens = token_ids[block_index * block_size : (block_index + 1) * block_size]
        parent = hashes[-1] if hashes else None
        keys = (*extra_keys, *first_block_keys) if block_index == 0 else extra_keys
        hashes.append(hash_block(parent, block_tokens, keys, algo))
    return hashes
