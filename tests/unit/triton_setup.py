"""Where the Triton kernel tests run. Off a GPU, the kernels run under Triton's interpreter,
which must be on before triton is first imported: tests/conftest.py sets TRITON_INTERPRET=1
(transformers imports triton, so a test module would be too late).

On a CUDA machine (scripts/gpu_check.sh) the same tests run on the GPU, bfloat16 included;
under the interpreter only float32 and float16 (its bfloat16 `tl.dot` is wrong).
"""

import os

import pytest
import torch

ON_GPU = torch.cuda.is_available()
if not ON_GPU and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("no GPU and TRITON_INTERPRET is not 1", allow_module_level=True)

triton = pytest.importorskip("triton", reason="triton is not installed")

DEVICE = torch.device("cuda" if ON_GPU else "cpu")
KERNEL_DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if ON_GPU else [])
# Absolute tolerance against a float64 reference fed the same rounded inputs.
TOLERANCE = {torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}
