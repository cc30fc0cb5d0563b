"""Where an engine runs: the device, its KV memory budget and its attention backend.

`--device auto` (the default) picks CUDA when torch sees a GPU, else the CPU; the environment
variable PDSERVE_DEVICE overrides "auto" for every entry point. On the CPU nothing changes
(torch paged attention with the C++ decode kernel, a fixed KV budget). On CUDA the KV pool
gets what the weights leave of `gpu_memory_utilization` x the GPU's total memory, and the
Triton backend runs attention.
"""

import logging
import os

import torch

from shared.attention.backend import AttentionBackend
from shared.config import EngineConfig
from shared.errors import InvalidRequestError
from shared.model.config import ModelConfig

logger = logging.getLogger(__name__)

ATTENTION_BACKENDS = ("auto", "torch", "triton")
# Left free on the GPU for a step's activations and the allocator's slack.
ACTIVATION_RESERVE_BYTES = 1 << 30


def resolve_device(name: str) -> torch.device:
    """"auto" | "cpu" | "cuda" | "cuda:N" -> a torch.device this process can use."""
    if name == "auto":
        name = os.environ.get("PDSERVE_DEVICE", "auto") or "auto"
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError as error:
        raise InvalidRequestError("device", f"{name!r} is not a device ({error})") from None
    if device.type not in ("cpu", "cuda"):
        raise InvalidRequestError("device", f"must be auto, cpu or cuda[:N], got {name!r}")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise InvalidRequestError("device", "cuda was asked for but torch sees no GPU")
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


def kv_cache_memory_bytes(config: EngineConfig, device: torch.device) -> int:
    """The KV pool's budget: the configured bytes on the CPU; on a GPU, the engine's share of
    the GPU's memory less what this process already holds (the weights) and a reserve for
    activations, and never more than is free."""
    if device.type != "cuda":
        return config.cache.kv_cache_memory_bytes
    utilization = config.cache.gpu_memory_utilization
    if not 0 < utilization <= 1:
        raise InvalidRequestError("gpu_memory_utilization", f"must be in (0, 1], got {utilization}")
    free, total = torch.cuda.mem_get_info(device)
    share = int(utilization * total) - torch.cuda.memory_reserved(device) - ACTIVATION_RESERVE_BYTES
    budget = max(0, min(share, free - ACTIVATION_RESERVE_BYTES))
    logger.info("GPU %s: %.1f of %.1f GiB free; KV pool budget %.2f GiB (utilization %.2f)", device,
                free / 2**30, total / 2**30, budget / 2**30, utilization)
    return budget


def make_attention_backend(name: str, device: torch.device, config: ModelConfig,
                           deterministic: bool = False) -> AttentionBackend:
    """The backend `name` ("auto": Triton on CUDA, torch on the CPU) for the model's heads;
    `deterministic` asks for the CPU's batch-invariant attention (torch backend only)."""
    if name not in ATTENTION_BACKENDS:
        raise InvalidRequestError("attention_backend", f"must be one of {ATTENTION_BACKENDS}, got {name!r}")
    if name == "auto":
        name = "triton" if device.type == "cuda" else "torch"
    if deterministic and name != "torch":
        raise InvalidRequestError("deterministic", f"runs on the CPU's torch attention backend only so far, "
                                                   f"not {name} on {device}")
    if name == "torch":
        if device.type != "cpu":
            raise InvalidRequestError("attention_backend", "the torch backend runs on the CPU only")
        from shared.attention.torch_paged import TorchPagedAttention
        return TorchPagedAttention(config.num_heads, config.num_kv_heads, config.head_dim,
                                   deterministic=deterministic)
    from shared.attention.triton_kernels import triton_available
    if not triton_available():
        raise InvalidRequestError("attention_backend", f"the triton package is needed on {device}")
    if device.type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        raise InvalidRequestError("attention_backend", "triton on the CPU needs TRITON_INTERPRET=1 in the "
                                                       "environment before start-up (tests only)")
    from shared.attention.triton_paged import TritonPagedAttention
    return TritonPagedAttention(config.num_heads, config.num_kv_heads, config.head_dim, device)
