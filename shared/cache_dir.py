"""pdserve's cache folder on this machine: converted models (shared.model.default_model) and
compiled C++ kernels (shared.native.build) live under it."""

import os
from pathlib import Path

CACHE_DIR_ENV_VAR = "PDSERVE_CACHE_DIR"


def pdserve_cache_dir() -> Path:
    """`$PDSERVE_CACHE_DIR`, else `~/.cache/pdserve`."""
    configured = os.environ.get(CACHE_DIR_ENV_VAR)
    if configured:
        return Path(configured).expanduser()
    return Path.home() / ".cache" / "pdserve"
