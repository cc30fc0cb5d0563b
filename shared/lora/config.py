"""LoRA settings of an engine (`LLM(enable_lora=True, max_loras=..., max_lora_rank=...)`)."""

from dataclasses import dataclass

from shared.errors import ConfigurationError


@dataclass
class LoRAConfig:
    # Serve LoRA adapters at all (off: a request that names one is refused).
    enable_lora: bool = False
    # Most distinct adapters in one engine step (requests for others wait for a later step).
    max_loras: int = 4
    # Largest adapter rank accepted; adapters of higher rank are refused at admission.
    max_lora_rank: int = 16
    # Adapters kept loaded in memory (least recently used ones are dropped and read from disk
    # again when needed); at least max_loras. None: 2 * max_loras.
    max_cpu_loras: int | None = None

    def validate(self) -> None:
        for name in ("max_loras", "max_lora_rank"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigurationError(name, f"must be an int >= 1, got {value!r}")
        if self.max_cpu_loras is not None and (not isinstance(self.max_cpu_loras, int)
                                               or self.max_cpu_loras < self.max_loras):
            raise ConfigurationError("max_cpu_loras", f"must be an int >= max_loras ({self.max_loras}), "
                                                      f"got {self.max_cpu_loras!r}")

    @property
    def num_cached_adapters(self) -> int:
        return self.max_cpu_loras if self.max_cpu_loras is not None else 2 * self.max_loras
