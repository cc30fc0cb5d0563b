"""A prompt's block hashes as each instance would compute them.

Instances register how they hash (shared.cluster.cache_settings.hash_recipe); the gateway
hashes a prompt once per recipe it meets (normally one for the whole deployment), with the
engines' own function, so a prefix-index lookup asks each instance for exactly its hashes.
A request for a LoRA adapter is hashed with the adapter's key as its instances registered it
(shared.lora.registry), so its prefix lookups never match the base model's or another
adapter's blocks.
"""

from collections.abc import Sequence

from shared.kv_cache.block_hash import BlockHash, HashRecipe, prompt_block_hashes


class PromptHashes:
    def __init__(self, token_ids: Sequence[int], cache_salt: str | None, adapter: str | None = None):
        self.token_ids = tuple(token_ids)
        self.cache_salt = cache_salt
        # The LoRA adapter's name (None: the base model), and its key, once the cluster view
        # chose the instances that serve it (services.gateway.cluster_view).
        self.adapter = adapter
        self.adapter_key: str | None = None
        self._by_recipe: dict[tuple[HashRecipe, str | None], list[BlockHash]] = {}

    def for_recipe(self, recipe: HashRecipe) -> list[BlockHash]:
        """Hashes of the prompt's full blocks under `recipe` (computed once per recipe)."""
        key = (recipe, self.adapter_key)
        hashes = self._by_recipe.get(key)
        if hashes is None:
            hashes = self._by_recipe[key] = prompt_block_hashes(self.token_ids, recipe, self.cache_salt,
                                                                adapter_key=self.adapter_key)
        return hashes
