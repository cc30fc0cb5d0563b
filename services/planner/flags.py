"""The planner's policy settings (SLOs, pool bounds, timing), shared by `pdserve serve planner`
and `pdserve up --autoscale`: each a flag, a PDSERVE_PLANNER_* variable and a key of the
`--config` TOML file (services.settings.service_settings)."""

import argparse

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from services.settings.service_settings import ServiceSettings
from services.settings.flags import add_settings_flags, settings_from_args
from services.planner.config import PlannerConfig, PoolBounds

PLANNER_ENV_PREFIX = "PDSERVE_PLANNER_"


class PlannerPolicySettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix=PLANNER_ENV_PREFIX)

    ttft_slo: float = Field(2.0, description="time-to-first-token SLO, seconds")
    itl_slo: float = Field(0.2, description="inter-token latency SLO, seconds")
    min_prefill: int = Field(1, description="fewest prefill instances")
    max_prefill: int = Field(4, description="most prefill instances")
    min_decode: int = Field(1, description="fewest decode instances")
    max_decode: int = Field(4, description="most decode instances")
    planner_interval: float = Field(10.0, description="seconds between planner decisions")
    scale_out_cooldown: float = Field(20.0, description="seconds after a scale event before scaling out again")
    scale_in_cooldown: float = Field(60.0, description="seconds after a scale event before scaling in")
    scale_in_patience: int = Field(3, description="intervals in a row that must agree before scaling in")
    scale_in_margin: float = Field(0.25, description="scale in only if the smaller pool holds at (1 + this) "
                                                     "x the load")

    def planner_config(self, max_batch_size: int = 128) -> PlannerConfig:
        """Raises ConfigurationError naming the bad setting."""
        return PlannerConfig(
            ttft_slo_s=self.ttft_slo, itl_slo_s=self.itl_slo,
            prefill=PoolBounds(self.min_prefill, self.max_prefill),
            decode=PoolBounds(self.min_decode, self.max_decode),
            interval_s=self.planner_interval, scale_out_cooldown_s=self.scale_out_cooldown,
            scale_in_cooldown_s=self.scale_in_cooldown, scale_in_patience=self.scale_in_patience,
            scale_in_margin=self.scale_in_margin, max_batch_size=max_batch_size)


def add_policy_arguments(parser: argparse.ArgumentParser) -> None:
    add_settings_flags(parser, PlannerPolicySettings)


def config_from_args(args: argparse.Namespace, max_batch_size: int = 128) -> PlannerConfig:
    """Flags > PDSERVE_PLANNER_* > args.config > defaults. Raises ConfigurationError naming
    the bad setting."""
    policy = settings_from_args(args, PlannerPolicySettings)
    return policy.planner_config(max_batch_size)
