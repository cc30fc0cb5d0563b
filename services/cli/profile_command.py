"""`pdserve profile`: measure one engine instance on this machine and write a profile JSON
(prefill time vs prompt length and prefix hits, decode step time vs batch and context, KV
capacity). The planner (`pdserve serve planner --profile`) and `pdserve simulate` read it."""

import argparse
import logging
from pathlib import Path

from services.settings.engine_flags import add_engine_flags, engine_args_from

DEFAULT_OUTPUT = Path("pdserve-profile.json")
# The engine settings of the profiled instance (EngineArgs fields, named as an instance's flags).
PROFILED_ENGINE_FLAGS = ("model", "dtype", "num_threads", "kv_cache_memory_gb")


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Called by services.cli.main.build_parser to register this subcommand."""
    parser = subparsers.add_parser(
        "profile", help="measure one instance's prefill and decode costs into a profile JSON",
        description="Runs the engine in-process on random prompts and writes what the planner and "
                    "the simulator need: prefill and decode costs, the KV transfer time over UCX on "
                    "loopback, and the slowdown beside a second busy instance on this host. The "
                    "default run takes 2-3 minutes on a quiet 2-core machine.")
    parser.add_argument("--output", "-o", type=Path, default=DEFAULT_OUTPUT,
                        help=f"where to write the JSON (default {DEFAULT_OUTPUT})")
    add_engine_flags(parser, PROFILED_ENGINE_FLAGS)
    parser.add_argument("--quick", action="store_true",
                        help="a few tiny points (for tests with a small model), seconds instead of minutes")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from services.planner.profiler import QUICK_PLAN, ProfilePlan, profile_instance

    logging.getLogger("services.planner").setLevel(logging.INFO)
    plan = QUICK_PLAN if args.quick else ProfilePlan()
    profile = profile_instance(engine_args_from(args), plan)
    profile.save(args.output)
    print(f"wrote {args.output}: KV capacity {profile.kv_capacity_tokens} tokens, "
          f"prefill 512 tokens {profile.prefill_s(512) * 1e3:.0f} ms, "
          f"decode step at batch 32 x 512 {profile.decode_step_s(32, 512) * 1e3:.0f} ms")
    transfer = profile.kv_transfer_s(512)
    if transfer is not None:
        print(f"KV transfer of 512 tokens {transfer * 1e3:.1f} ms; "
              f"beside a busy neighbour x{profile.colocated_slowdown:.2f} on {profile.host_cores} cores")
    return 0
