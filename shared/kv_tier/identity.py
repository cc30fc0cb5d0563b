"""Which arena files an engine may share: one per (cache settings, model files) fingerprint.

The block hashes already cover the model id, the tokens and the tenant salt; the fingerprint
adds what else makes two engines' blocks interchangeable: the KV dtype, block size, hash
algorithm and layout, the model's files themselves (two folders of the same name with other
weights never share), and deterministic mode (its KV is bitwise batch-invariant; blocks of a
non-deterministic engine would break that promise).
"""

import hashlib
import socket
from pathlib import Path

from shared.kv_cache.layout import KVCacheLayout

TIER_FORMAT = "pdserve-kv-tier-1"
_MODEL_FILE_SUFFIXES = (".safetensors", ".json", ".gguf", ".bin")


def model_files_identity(model_path: str | None) -> str:
    """Path, names, sizes and modification times of the model's files ("" when unknown)."""
    if not model_path:
        return ""
    path = Path(model_path).expanduser()
    if not path.exists():
        return model_path
    files = sorted(path.iterdir()) if path.is_dir() else [path]
    parts = [str(path.resolve())]
    for file in files:
        if file.is_file() and file.suffix in _MODEL_FILE_SUFFIXES:
            stat = file.stat()
            parts.append(f"{file.name}:{stat.st_size}:{stat.st_mtime_ns}")
    return "|".join(parts)


def cache_fingerprint(model_id: str, model_files: str, layout: KVCacheLayout, hash_algo: str,
                      deterministic: bool) -> bytes:
    text = (f"{TIER_FORMAT};model_id={model_id};files={model_files};dtype={layout.dtype};"
            f"block_size={layout.block_size};hash={hash_algo};layout={layout.description};"
            f"deterministic={deterministic}")
    return hashlib.sha256(text.encode()).digest()


def arena_path(directory: str | Path, fingerprint: bytes, tier: str) -> Path:
    return Path(directory) / f"pdserve-kv-{fingerprint.hex()[:16]}.{tier}"


def tier_id(directory: str | Path, fingerprint: bytes) -> str:
    """A name for this host's tier in the prefix index: the same for every instance of the host
    that shares it, different on another host."""
    where = f"{socket.gethostname()}|{Path(directory).resolve()}|{fingerprint.hex()}"
    return "tier-" + hashlib.sha256(where.encode()).hexdigest()[:16]
