"""LoRA adapters served beside the base model, batched together (see docs/lora.md)."""

from shared.lora.config import LoRAConfig
from shared.lora.request import LoRARequest

__all__ = ["LoRAConfig", "LoRARequest"]
