"""The one prefix-hash recipe: what it covers (model id, salt, block size, algorithm), that an
engine's KV cache manager hashes through it with its own algorithm, and that an unknown
algorithm is an error instead of a silent fallback."""

import pytest

from shared.core.request import Request
from shared.errors import InvalidRequestError
from shared.kv_cache.block_hash import (
    SUPPORTED_HASH_ALGOS, HashRecipe, hash_block, hash_full_blocks, prompt_block_hashes)
from shared.kv_cache.block_pool import BlockPool
from shared.core.kv_cache_manager import KVCacheManager
from shared.sampling.params import SamplingParams

TOKENS = list(range(40))


def test_the_recipe_covers_model_id_salt_block_size_and_algorithm():
    base = prompt_block_hashes(TOKENS, HashRecipe("m", 16))
    assert base == hash_full_blocks(TOKENS, 16, ("m",))
    assert prompt_block_hashes(TOKENS, HashRecipe("m", 16), "tenant") == hash_full_blocks(TOKENS, 16, ("m", "tenant"))
    assert prompt_block_hashes(TOKENS, HashRecipe("m", 16), "") == base  # no salt
    others = [prompt_block_hashes(TOKENS, recipe) for recipe in
              (HashRecipe("n", 16), HashRecipe("m", 8), HashRecipe("m", 16, "blake2b"))]
    assert all(hashes[0] != base[0] for hashes in others)
    assert len(others[1]) == 5 and len(base) == 2
    assert prompt_block_hashes(TOKENS, HashRecipe("m", 16), known_hashes=base[:1]) == base


def test_both_algorithms_give_32_byte_digests():
    for algo in SUPPORTED_HASH_ALGOS:
        assert len(hash_block(None, [1, 2, 3], ("m",), algo)) == 32


def test_an_unknown_algorithm_is_refused_everywhere():
    with pytest.raises(InvalidRequestError, match="^prefix_hash_algo: must be one of"):
        hash_block(None, [1], algo="md5")
    with pytest.raises(InvalidRequestError, match="^prefix_hash_algo"):
        HashRecipe("m", 16, "sha1")
    with pytest.raises(InvalidRequestError, match="^prefix_hash_algo"):
        KVCacheManager(BlockPool(2), 16, True, hash_algo="md5")
    with pytest.raises(InvalidRequestError, match="^block_size"):
        HashRecipe("m", 0)


@pytest.mark.parametrize("algo", SUPPORTED_HASH_ALGOS)
def test_the_engine_hashes_with_its_own_algorithm_through_the_shared_function(algo):
    manager = KVCacheManager(BlockPool(4), 16, True, hash_algo=algo, model_key="m")
    request = Request("r", TOKENS, SamplingParams(), cache_salt="tenant")
    manager.update_block_hashes(request)
    assert request.block_hashes == prompt_block_hashes(TOKENS, HashRecipe("m", 16, algo), "tenant")
    assert manager.hash_recipe == HashRecipe("m", 16, algo)
