"""The planner's policy flags (SLOs, pool bounds, timing), shared by `pdserve serve planner`
and `pdserve up --autoscale`; every flag has a PDSERVE_PLANNER_* environment default."""

import argparse
import os

from services.planner.config import PlannerConfig, PoolBounds

# flag -> (type, default, help)
POLICY_FLAGS = {
    "ttft-slo": (float, 2.0, "time-to-first-token SLO, seconds"),
    "itl-slo": (float, 0.2, "inter-token latency SLO, seconds"),
    "min-prefill": (int, 1, "fewest prefill instances"),
    "max-prefill": (int, 4, "most prefill instances"),
    "min-decode": (int, 1, "fewest decode instances"),
    "max-decode": (int, 4, "most decode instances"),
    "planner-interval": (float, 10.0, "seconds between planner decisions"),
    "scale-out-cooldown": (float, 20.0, "seconds after a scale event before scaling out again"),
    "scale-in-cooldown": (float, 60.0, "seconds after a scale event before scaling in"),
    "scale-in-patience": (int, 3, "intervals in a row that must agree before scaling in"),
    "scale-in-margin": (float, 0.25, "scale in only if the smaller pool holds at (1 + this) x the load"),
}


def _env_name(flag: str) -> str:
    return "PDSERVE_PLANNER_" + flag.upper().replace("-", "_")


def add_policy_arguments(parser: argparse.ArgumentParser) -> None:
    for flag, (kind, default, text) in POLICY_FLAGS.items():
        env = os.environ.get(_env_name(flag))
        parser.add_argument(f"--{flag}", type=kind, default=kind(env) if env else default,
                            help=f"{text} (default {default}; env {_env_name(flag)})")


def config_from_args(args: argparse.Namespace, max_batch_size: int = 128) -> PlannerConfig:
    """Raises InvalidRequestError naming the bad setting."""
    return PlannerConfig(
        ttft_slo_s=args.ttft_slo, itl_slo_s=args.itl_slo,
        prefill=PoolBounds(args.min_prefill, args.max_prefill), decode=PoolBounds(args.min_decode, args.max_decode),
        interval_s=args.planner_interval, scale_out_cooldown_s=args.scale_out_cooldown,
        scale_in_cooldown_s=args.scale_in_cooldown, scale_in_patience=args.scale_in_patience,
        scale_in_margin=args.scale_in_margin, max_batch_size=max_batch_size)
