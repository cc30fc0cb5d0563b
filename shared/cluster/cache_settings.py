"""Cache settings in an instance's Redis record, and which of them two instances must share.

Every instance registers the settings its KV cache was built with (shared.engine_api.client's
CacheSettings) next to its address, as flat `cache_*` string fields of its instance hash. A
gateway reads them to hash prompts exactly as each instance does (`hash_recipe`) and to pair
only a prefill and a decode instance whose KV is interchangeable (`cache_mismatches`).

tensor_parallel_size is registered but not compared: the KV wire format is the full, unsharded
layout (a parallel engine gathers its ranks' shards before sending and scatters them on
arrival), so a pipeline-parallel prefill may feed a tensor-parallel decode instance.
"""

from dataclasses import asdict, fields

from shared.engine_api.client import CacheSettings
from shared.errors import InvalidRequestError
from shared.kv_cache.block_hash import HashRecipe, check_hash_algo

FIELD_PREFIX = "cache_"
# What a prefill and a decode instance must agree on for one's KV blocks to be the other's.
PAIRED_FIELDS = ("model_id", "block_size", "prefix_hash_algo", "dtype", "kv_layout")
_INT_FIELDS = ("block_size", "tensor_parallel_size")


def validate_cache_settings(cache: CacheSettings) -> CacheSettings:
    """Raise InvalidRequestError naming the first bad field; return `cache` unchanged."""
    for name in ("model_id", "dtype", "kv_layout"):
        value = getattr(cache, name)
        if not isinstance(value, str) or not value:
            raise InvalidRequestError(f"cache.{name}", f"must be a non-empty string, got {value!r}")
    for name in _INT_FIELDS:
        value = getattr(cache, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InvalidRequestError(f"cache.{name}", f"must be an int >= 1, got {value!r}")
    try:
        check_hash_algo(cache.prefix_hash_algo)
    except InvalidRequestError as error:
        raise InvalidRequestError("cache.prefix_hash_algo", error.message) from None
    return cache


def hash_recipe(cache: CacheSettings) -> HashRecipe:
    """How the instance hashes prompt blocks (what its prefix-index entries are made of)."""
    return HashRecipe(cache.model_id, cache.block_size, cache.prefix_hash_algo)


def paired_key(cache: CacheSettings | None) -> tuple | None:
    """Equal for two instances exactly when they can pair; None for one without settings."""
    return None if cache is None else tuple(getattr(cache, name) for name in PAIRED_FIELDS)


def cache_mismatches(first: CacheSettings | None, second: CacheSettings | None) -> list[str]:
    """The paired settings that differ, e.g. ["block_size 16 != 32"]; [] when compatible.
    An instance that registered no settings (an older version) pairs with nobody."""
    if first is None or second is None:
        return ["cache settings not registered"]
    return [f"{name} {getattr(first, name)} != {getattr(second, name)}"
            for name in PAIRED_FIELDS if getattr(first, name) != getattr(second, name)]


def encode_cache_settings(cache: CacheSettings) -> dict[str, str]:
    """`cache_*` hash fields, every value a string."""
    return {FIELD_PREFIX + name: str(value) for name, value in asdict(validate_cache_settings(cache)).items()}


def decode_cache_settings(hash_fields: dict[str, str]) -> CacheSettings | None:
    """Inverse of encode_cache_settings; None when the record carries none. Raises
    KeyError/ValueError (InvalidRequestError is one) on a partial or malformed set."""
    names = [field.name for field in fields(CacheSettings)]
    if not any(FIELD_PREFIX + name in hash_fields for name in names):
        return None
    values = {name: hash_fields[FIELD_PREFIX + name] for name in names}
    for name in _INT_FIELDS:
        values[name] = int(values[name])
    return validate_cache_settings(CacheSettings(**values))
