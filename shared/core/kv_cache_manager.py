"""Which blocks each request holds: allocation, prefix hits, caching of full blocks, freeing.

The scheduler asks; the pool keeps the counts. Each request's block table grows as its
computed-token count catches up with its token count.

A lower tier (`lower_tier`, the KV tiers of shared.kv_tier) extends the prefix cache: where
the pool's own hits end, it may load the blocks that follow into the pool, and it sees every
request's blocks when they are freed.
"""

import logging
from typing import Protocol

from shared.core.request import Request
from shared.kv_cache.block_hash import HashRecipe, block_extra_keys, prompt_block_hashes
from shared.kv_cache.block_pool import BlockPool, KVBlock
from shared.kv_cache.blocks import blocks_for_tokens
from shared.kv_events.wire import MEDIUM_POOL

logger = logging.getLogger(__name__)


class LowerTier(Protocol):
    def load(self, request: Request, hits: list[KVBlock], max_blocks: int) -> list[KVBlock]:
        """Blocks len(hits).. of `request` loaded into the pool (cached, free), or []."""

    def on_freed(self, blocks: list[KVBlock]) -> None:
        """A request is about to free these blocks (their KV still intact)."""


class KVCacheManager:
    def __init__(self, pool: BlockPool, block_size: int, enable_prefix_caching: bool,
                 hash_algo: str = "sha256", model_key: str = ""):
        self.pool = pool
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.hash_algo = hash_algo
        self.model_key = model_key
        self.hash_recipe = HashRecipe(model_key, block_size, hash_algo)  # validates the algorithm
        self._blocks: dict[str, list[KVBlock]] = {}
        self._num_cached_blocks: dict[str, int] = {}
        self.lower_tier: LowerTier | None = None

    def block_ids(self, request_id: str) -> list[int]:
        return [block.block_id for block in self._blocks.get(request_id, [])]

    def num_blocks_held(self, request_id: str) -> int:
        return len(self._blocks.get(request_id, []))

    def update_block_hashes(self, request: Request) -> None:
        request.block_hashes = prompt_block_hashes(request.all_token_ids, self.hash_recipe, request.cache_salt,
                                                   request.block_hashes, request.adapter_key)

    def find_cached_prefix(self, request: Request, max_blocks: int | None = None) -> list[KVBlock]:
        """The longest run of leading full blocks already in the prefix cache (or loaded into
        it from the lower tier), at most `max_blocks`.

        By default it never covers the last token: its logits are needed, so at least one token
        is computed.
        """
        if not self.enable_prefix_caching or request.sampling_params.prompt_logprobs is not None:
            return []
        self.update_block_hashes(request)
        if max_blocks is None:
            max_blocks = (request.num_tokens - 1) // self.block_size
        hits = []
        while len(hits) < max_blocks:
            start = len(hits) * self.block_size
            block = self.pool.lookup(request.block_hashes[len(hits)],
                                     tuple(request.all_token_ids[start:start + self.block_size]))
            if block is not None:
                hits.append(block)
                continue
            loaded = self.lower_tier.load(request, hits, max_blocks) if self.lower_tier is not None else []
            if not loaded:
                break
            if self.pool.kv_event_log is not None:  # loaded into the pool's prefix cache
                self._record_stored(request, list(range(len(hits), len(hits) + len(loaded))))
            hits += loaded
        return hits

    def allocate(self, request: Request, num_new_tokens: int,
                 prefix_blocks: list[KVBlock] | None = None) -> bool:
        """Give `request` blocks for `num_new_tokens` more tokens, after `prefix_blocks`
        (prefix hits or a sibling's shared prompt blocks, adopted first). False, with
        nothing changed, when the pool lacks room."""
        prefix_blocks = prefix_blocks or []
        held = self._blocks.get(request.request_id, [])
        num_computed = request.num_computed_tokens + len(prefix_blocks) * self.block_size
        num_needed = blocks_for_tokens(num_computed + num_new_tokens, self.block_size)
        num_new_blocks = max(0, num_needed - len(held) - len(prefix_blocks))
        num_revived = sum(1 for block in prefix_blocks if block.ref_count == 0)
        if num_new_blocks + num_revived > self.pool.num_free_blocks:
            return False
        self.pool.touch(prefix_blocks)
        self._blocks[request.request_id] = held + prefix_blocks + self.pool.allocate(num_new_blocks)
        if prefix_blocks:
            self._num_cached_blocks[request.request_id] = len(prefix_blocks)
        return True

    def cache_computed_blocks(self, request: Request) -> None:
        """Register the request's newly full and computed blocks in the prefix cache."""
        if not self.enable_prefix_caching:
            return
        num_full = request.num_computed_tokens // self.block_size
        first = self._num_cached_blocks.get(request.request_id, 0)
        if num_full <= first:
            return
        self.update_block_hashes(request)
        blocks = self._blocks[request.request_id]
        newly_cached = []
        for index in range(first, num_full):
            start = index * self.block_size
            tokens = tuple(request.all_token_ids[start:start + self.block_size])
            if self.pool.cache(blocks[index], request.block_hashes[index], tokens):
                newly_cached.append(index)
        self._num_cached_blocks[request.request_id] = num_full
        if newly_cached and self.pool.kv_event_log is not None:
            self._record_stored(request, newly_cached)

    def _record_stored(self, request: Request, indices: list[int]) -> None:
        """KV events: one BlockStored per run of consecutive blocks of `request` that the prefix
        cache just gained (their parent, tokens, adapter and extra keys)."""
        lora = request.lora_request
        for run in _consecutive_runs(indices):
            keys = [block_extra_keys(self.hash_recipe, index, request.cache_salt, request.adapter_key) or None
                    for index in run]
            parent = request.block_hashes[run[0] - 1] if run[0] else None
            tokens = request.all_token_ids[run[0] * self.block_size:(run[-1] + 1) * self.block_size]
            self.pool.kv_event_log.stored(
                [request.block_hashes[index] for index in run], parent, tokens, self.block_size, MEDIUM_POOL,
                lora.lora_int_id if lora else None, lora.lora_name if lora else None, keys if any(keys) else None)

    def free(self, request: Request) -> None:
        blocks = self._blocks.pop(request.request_id, [])
        self._num_cached_blocks.pop(request.request_id, None)
        if self.lower_tier is not None and blocks:
            self.lower_tier.on_freed(blocks)
        self.pool.free(list(reversed(blocks)))

    def shared_prompt_blocks(self, parent: Request, child: Request) -> list[KVBlock]:
        """Full, computed prompt blocks of `parent` that `child` (same prompt) can share,
        leaving the child at least its last prompt token to compute."""
        parent_blocks = self._blocks.get(parent.request_id, [])
        num_shareable = min(parent.num_computed_tokens, child.num_tokens - 1) // self.block_size
        return parent_blocks[:num_shareable]


def _consecutive_runs(indices: list[int]) -> list[list[int]]:
    """[0, 1, 3] -> [[0, 1], [3]]."""
    runs = [[indices[0]]]
    for index in indices[1:]:
        if index == runs[-1][-1] + 1:
            runs[-1].append(index)
        else:
            runs.append([index])
    return runs
