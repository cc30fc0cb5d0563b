"""RMSNorm and the rotary embedding as one C++ pass each (csrc/layer_ops.cpp), for the CPU model.

torch spends ~60 us a call on these at decode sizes (a batch of 64 rows, SmolLM2's widths), most
of it dispatching their several ops, which adds up to ~9 ms of a 30-layer decode step on one
thread; one ctypes call each does the same work in a few microseconds. They round exactly as
transformers' Llama does (the header of the source says how). Built on first use like the
attention kernel (shared/native/build.py); `load_cpu_layer_ops()` is None where it cannot build
or PDSERVE_NATIVE_KERNELS=0, and the model then uses the torch versions (layer_ops.py).
"""

import ctypes
import functools
from pathlib import Path

import torch

from shared.model.rotary import RotaryTables
from shared.native.build import load_library

SOURCE = Path(__file__).parent / "csrc" / "layer_ops.cpp"
_SUFFIXES = {torch.bfloat16: "bf16", torch.float32: "f32"}


class CpuLayerOps:
    """The library's entry points behind the model's layer-ops interface (layer_ops.py)."""

    def __init__(self, library: ctypes.CDLL):
        self._rms_norm, self._rotate = {}, {}
        for dtype, suffix in _SUFFIXES.items():
            rms_norm = getattr(library, f"pdserve_rms_norm_{suffix}")
            rms_norm.restype = None
            rms_norm.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_float, ctypes.c_void_p, ctypes.c_int64,
                                                         ctypes.c_int64, ctypes.c_int]
            rotate = getattr(library, f"pdserve_rotate_in_place_{suffix}")
            rotate.restype = None
            rotate.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int, ctypes.c_int,
                               ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]
            self._rms_norm[dtype], self._rotate[dtype] = rms_norm, rotate
        self.max_head_dim = library.pdserve_layer_ops_max_head_dim()

    def supports(self, dtype: torch.dtype, head_dim: int) -> bool:
        return dtype in self._rms_norm and head_dim <= self.max_head_dim

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float,
                 residual: torch.Tensor | None = None) -> torch.Tensor:
        """RMSNorm of each row of x (rows, width); with `residual`, first `residual += x` (in
        place) and normalize that."""
        x = x.contiguous()
        if residual is not None and not residual.is_contiguous():
            raise ValueError("residual: the CPU RMSNorm adds into a contiguous tensor only")
        output = torch.empty_like(x)
        rows, width = x.shape
        self._rms_norm[x.dtype](x.data_ptr(), None if residual is None else residual.data_ptr(),
                                weight.data_ptr(), eps, output.data_ptr(), rows, width, torch.get_num_threads())
        return output

    def rotate(self, x: torch.Tensor, tables: RotaryTables) -> torch.Tensor:
        """Rotate x (tokens, heads, head_dim), each token's heads contiguous, in place."""
        tokens, heads, head_dim = x.shape
        if x.stride(2) != 1 or x.stride(1) != head_dim:
            raise ValueError("x: the CPU rotary embedding needs each token's heads contiguous")
        cos, signed_sin = tables.cos.contiguous(), tables.signed_sin.contiguous()
        self._rotate[x.dtype](x.data_ptr(), tokens, x.stride(0), heads, head_dim, cos.data_ptr(),
                              signed_sin.data_ptr(), torch.get_num_threads())
        return x


@functools.cache
def load_cpu_layer_ops() -> CpuLayerOps | None:
    """The library, built on first use; None when disabled (PDSERVE_NATIVE_KERNELS=0) or unbuildable."""
    return load_library(SOURCE, CpuLayerOps, "the model's norms and rotary use torch")
