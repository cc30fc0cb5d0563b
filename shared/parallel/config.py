"""How one model replica is split: tensor-parallel ranks per stage times pipeline stages."""

from dataclasses import dataclass

from shared.errors import ConfigurationError


@dataclass
class ParallelConfig:
    # Ranks sharing each layer (its heads and MLP columns); must divide the attention and KV heads.
    tensor_parallel_size: int = 1
    # Stages, each running a contiguous slice of the layers.
    pipeline_parallel_size: int = 1
    # Seconds the engine waits for a step's result before declaring the workers hung.
    worker_step_timeout_s: float = 300.0

    def __post_init__(self) -> None:
        for name in ("tensor_parallel_size", "pipeline_parallel_size"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ConfigurationError(name, f"must be an integer >= 1, got {getattr(self, name)!r}")
        if self.worker_step_timeout_s <= 0:
            raise ConfigurationError("worker_step_timeout_s", "must be > 0")

    @property
    def world_size(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size

    @property
    def is_parallel(self) -> bool:
        return self.world_size > 1

    def check_model(self, num_heads: int, num_kv_heads: int, num_layers: int) -> None:
        """Raise a clear error when the model cannot be split this way."""
        tp, pp = self.tensor_parallel_size, self.pipeline_parallel_size
        if num_heads % tp or num_kv_heads % tp:
            raise ConfigurationError(
                "tensor_parallel_size", f"{tp} must divide the model's {num_heads} attention heads "
                                        f"and {num_kv_heads} KV heads")
        if pp > num_layers:
            raise ConfigurationError(
                "pipeline_parallel_size", f"{pp} stages for only {num_layers} layers")


def stage_layers(num_layers: int, num_stages: int, stage: int) -> range:
    """The layers stage `stage` runs: contiguous, sizes differing by at most one (earlier
    stages take the remainder, since the last one also runs the LM head)."""
    base, extra = divmod(num_layers, num_stages)
    start = stage * base + min(stage, extra)
    return range(start, start + base + (1 if stage < extra else 0))
