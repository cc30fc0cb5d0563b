"""What an engine holds, in bytes, for `pdserve:memory_bytes`: its weights and KV pool (the
target's and a draft model's), and the usage of its bounded caches."""

from shared.memory.cache_usage import CacheUsage
from shared.memory.components import module_bytes, tensor_bytes


def _runner(executor):
    """The in-process model runner (executors of other kinds expose none: their sizes read 0)."""
    return getattr(executor, "runner", None)


def _draft_proposer(executor):
    speculator = getattr(_runner(executor), "speculator", None)
    return getattr(speculator, "proposer", None)


def weight_bytes(executor) -> int:
    """The target model's parameters and buffers, plus a draft model's if any."""
    target = getattr(_runner(executor), "model", None)
    return module_bytes(target) + module_bytes(getattr(_draft_proposer(executor), "model", None))


def kv_pool_bytes(executor) -> int:
    caches = [getattr(_runner(executor), "kv_cache", None), getattr(_draft_proposer(executor), "kv_cache", None)]
    return tensor_bytes([cache for cache in caches if cache is not None])


def grammar_cache_usage(core) -> CacheUsage | None:
    """The compiled-grammar cache, once a guided request has built it (None before)."""
    grammars = getattr(core.guided, "_grammars", None)  # built lazily; None until then
    if grammars is None:
        return None
    try:  # read from the metrics thread while the engine thread may be adding an entry
        compiled = list(getattr(grammars, "_entries", {}).values())
    except RuntimeError:
        compiled = None
    size = -1 if compiled is None else sum(getattr(grammar, "memory_size_bytes", 0) for grammar in compiled)
    return CacheUsage("compiled_grammars", len(grammars), getattr(grammars, "max_entries", -1), size)
