"""PlannerConfig: SLOs, pool bounds, interval, hysteresis and cooldowns."""

from dataclasses import dataclass

from shared.errors import ConfigurationError


@dataclass(frozen=True)
class PoolBounds:
    min_replicas: int = 1
    max_replicas: int = 4

    def clamp(self, replicas: int) -> int:
        return max(self.min_replicas, min(self.max_replicas, replicas))


@dataclass(frozen=True)
class PlannerConfig:
    ttft_slo_s: float = 2.0
    itl_slo_s: float = 0.2
    prefill: PoolBounds = PoolBounds()
    decode: PoolBounds = PoolBounds()
    interval_s: float = 10.0
    # Highest planned utilization of a prefill instance (queueing keeps TTFT within the SLO
    # below this anyway; the cap is headroom for bursts).
    max_prefill_utilization: float = 0.85
    # Scale in only if the pool would still suffice at this much more load (hysteresis band).
    scale_in_margin: float = 0.25
    # ... and only after this many intervals in a row that say so.
    scale_in_patience: int = 3
    scale_out_cooldown_s: float = 20.0
    scale_in_cooldown_s: float = 60.0
    max_scale_in_step: int = 1
    max_batch_size: int = 128  # an instance's --max-num-seqs
    # Used until the first requests complete.
    default_prompt_tokens: float = 256.0
    default_output_tokens: float = 128.0

    def __post_init__(self) -> None:
        for name in ("ttft_slo_s", "itl_slo_s", "interval_s", "max_prefill_utilization"):
            if not getattr(self, name) > 0:
                raise ConfigurationError(name, f"must be > 0, got {getattr(self, name)!r}")
        for role, bounds in (("prefill", self.prefill), ("decode", self.decode)):
            if not 0 <= bounds.min_replicas <= bounds.max_replicas or bounds.max_replicas < 1:
                raise ConfigurationError(f"{role} bounds", f"need 0 <= min <= max and max >= 1, got "
                                                            f"{bounds.min_replicas}..{bounds.max_replicas}")
        if self.scale_in_patience < 1 or self.max_scale_in_step < 1:
            raise ConfigurationError("scale_in_patience", "scale_in_patience and max_scale_in_step must be >= 1")

    def bounds(self, role: str) -> PoolBounds:
        return self.prefill if role == "prefill" else self.decode
