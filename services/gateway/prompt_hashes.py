"""A prompt's block hashes as each instance would compute them.

Instances register how they hash (shared.cluster.cache_settings.hash_recipe); the gateway
hashes a prompt once per recipe it meets (normally one for the whole deployment), with the
engines' own function, so a prefix-index lookup asks each instance for exactly its hashes.
"""

from collections.abc import Sequence

from shared.kv_cache.block_hash import BlockHash, HashRecipe, prompt_block_hashes


class PromptHashes:
    def __init__(self, token_ids: Sequence[int], cache_salt: str | None):
        self.token_ids = tuple(token_ids)
        self.cache_salt = cache_salt
        self._by_recipe: dict[HashRecipe, list[BlockHash]] = {}

    def for_recipe(self, recipe: HashRecipe) -> list[BlockHash]:
        """Hashes of the prompt's full blocks under `recipe` (computed once per recipe)."""
        hashes = self._by_recipe.get(recipe)
        if hashes is None:
            hashes = self._by_recipe[recipe] = prompt_block_hashes(self.token_ids, recipe, self.cache_salt)
        return hashes
