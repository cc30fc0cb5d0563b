"""Triton kernels for the GPU path: paged attention (decode and prefill), the KV-cache write,
fused RMSNorm + residual and rotary embedding.

Each kernel's module has one launcher taking torch tensors; the CUDA attention backend
(`shared/attention/triton_paged.py`) and the model call them. On a machine without a GPU they
run under Triton's interpreter (`TRITON_INTERPRET=1`, set before triton is imported): that is
how the unit tests check them against float64 references.
"""

import functools
import importlib.util


@functools.cache
def triton_available() -> bool:
    """Whether the triton package is importable (it is a pinned dependency; some stripped
    environments lack it)."""
    return importlib.util.find_spec("triton") is not None
