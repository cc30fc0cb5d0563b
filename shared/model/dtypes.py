"""The dtypes an engine runs in, by the names its settings and flags accept."""

import torch

from shared.errors import ConfigurationError

DTYPES = {"bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float32": torch.float32, "fp32": torch.float32}


def parse_dtype(name: str) -> torch.dtype:
    if name not in DTYPES:
        raise ConfigurationError("dtype", f"{name!r} is not one of {sorted(DTYPES)}")
    return DTYPES[name]
