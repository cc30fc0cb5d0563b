"""`pdserve up`: run a local stack (Redis, prefill, decode or colocated instances, a gateway)
as separate processes on loopback until Ctrl-C or SIGTERM.

Every flag has an environment variable (shown in --help); flags win over variables.
"""

import argparse
import os
from pathlib import Path

DTYPE_CHOICES = ("bfloat16", "float32")


def _env(name: str, default, convert=str):
    value = os.environ.get(name)
    return default if value in (None, "") else convert(value)


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").lower() in ("1", "true", "yes", "on")


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Called by services.cli.main.build_parser to register this subcommand."""
    parser = subparsers.add_parser(
        "up", help="run a local stack: redis, prefill, decode and a gateway",
        description="Starts redis-server, the engine instances and a gateway as separate "
                    "processes, waits until all are healthy, prints where to send requests, "
                    "restarts any that dies (with backoff, up to a crash-loop limit), and stops "
                    "everything on Ctrl-C or SIGTERM, draining each service first.")
    add_stack_arguments(parser)
    add_autoscale_arguments(parser)
    parser.set_defaults(run=run)


def add_stack_arguments(parser: argparse.ArgumentParser) -> None:
    """The stack's flags, each with a PDSERVE_UP_* (or PDSERVE_*) environment default."""
    parser.add_argument("--num-prefill", type=int, default=_env("PDSERVE_UP_NUM_PREFILL", 1, int),
                        help="prefill instances (default 1; env PDSERVE_UP_NUM_PREFILL)")
    parser.add_argument("--num-decode", type=int, default=_env("PDSERVE_UP_NUM_DECODE", 1, int),
                        help="decode (or colocated) instances (default 1; env PDSERVE_UP_NUM_DECODE)")
    parser.add_argument("--colocated", action="store_true", default=_env_flag("PDSERVE_UP_COLOCATED"),
                        help="run --num-decode colocated instances and no prefill ones "
                             "(env PDSERVE_UP_COLOCATED=1)")
    parser.add_argument("--host", default=_env("PDSERVE_UP_HOST", "127.0.0.1"),
                        help="address every service binds (default 127.0.0.1; env PDSERVE_UP_HOST)")
    parser.add_argument("--gateway-port", type=int, default=_env("PDSERVE_UP_GATEWAY_PORT", 50051, int),
                        help="gateway gRPC port, 0 = any free one (default 50051; env PDSERVE_UP_GATEWAY_PORT)")
    parser.add_argument("--model", default=_env("PDSERVE_MODEL", None),
                        help="HF folder or GGUF file (default: bundled SmolLM2; env PDSERVE_MODEL)")
    parser.add_argument("--dtype", choices=DTYPE_CHOICES, default=_env("PDSERVE_DTYPE", "bfloat16"),
                        help="engine dtype (default bfloat16; env PDSERVE_DTYPE)")
    parser.add_argument("--device", default=_env("PDSERVE_DEVICE", None),
                        help="every instance's device: auto, cpu, cuda or cuda:N (default auto; env PDSERVE_DEVICE)")
    parser.add_argument("--gpu-memory-utilization", type=float, default=None,
                        help="on a GPU: each instance's share of its memory (default 0.9; instances "
                             "sharing one GPU must together stay below 1)")
    parser.add_argument("--num-threads", type=int, default=_env("PDSERVE_NUM_THREADS", None, int),
                        help="torch threads per instance (default: one per CPU the instance is given, see "
                             "docs/performance.md; env PDSERVE_NUM_THREADS)")
    parser.add_argument("--deterministic", action="store_true", default=_env_flag("PDSERVE_DETERMINISTIC"),
                        help="batch-invariant instances: greedy output identical to the offline engine's "
                             "with deterministic=True (env PDSERVE_DETERMINISTIC=1; docs/deterministic.md)")
    parser.add_argument("--redis-url", default=_env("PDSERVE_UP_REDIS_URL", None),
                        help="use this Redis instead of starting redis-server (env PDSERVE_UP_REDIS_URL)")
    parser.add_argument("--run-dir", type=Path, default=_env("PDSERVE_UP_RUN_DIR", None, Path),
                        help="folder for logs and ready files (default: a new temp folder; env PDSERVE_UP_RUN_DIR)")
    parser.add_argument("--ready-timeout", type=float, default=_env("PDSERVE_UP_READY_TIMEOUT", 600.0, float),
                        help="seconds to wait for every service to be SERVING (default 600)")
    parser.add_argument("--stop-grace", type=float, default=_env("PDSERVE_UP_STOP_GRACE", 30.0, float),
                        help="seconds between SIGTERM (instances and gateway drain) and SIGKILL "
                             "when stopping (default 30)")
    parser.add_argument("--prefill-cpus", type=_cpu_list, default=_env("PDSERVE_UP_PREFILL_CPUS", None, _cpu_list),
                        help="pin every prefill process to these CPU ids, e.g. 0 or 0,1 "
                             "(default: not pinned; env PDSERVE_UP_PREFILL_CPUS)")
    parser.add_argument("--decode-cpus", type=_cpu_list, default=_env("PDSERVE_UP_DECODE_CPUS", None, _cpu_list),
                        help="pin every decode (or colocated) process to these CPU ids "
                             "(default: not pinned; env PDSERVE_UP_DECODE_CPUS)")
    parser.add_argument("--gateway-cpus", type=_cpu_list, default=_env("PDSERVE_UP_GATEWAY_CPUS", None, _cpu_list),
                        help="pin the gateway and the stack's redis-server to these CPU ids, e.g. the "
                             "prefill's to keep decode cores for decoding (default: not pinned; "
                             "env PDSERVE_UP_GATEWAY_CPUS)")
    parser.add_argument("--tensor-parallel-size", type=int,
                        default=_env("PDSERVE_TENSOR_PARALLEL_SIZE", 1, int),
                        help="ranks sharing each layer, per instance (env PDSERVE_TENSOR_PARALLEL_SIZE)")
    parser.add_argument("--pipeline-parallel-size", type=int,
                        default=_env("PDSERVE_PIPELINE_PARALLEL_SIZE", 1, int),
                        help="pipeline stages per instance (env PDSERVE_PIPELINE_PARALLEL_SIZE)")
    for kind in ("gateway", "instance", "prefill", "decode"):
        parser.add_argument(f"--{kind}-arg", dest=f"{kind}_args", action="append", default=[],
                            metavar="ARG", help=f"extra argument for every {kind} process (repeatable; "
                                                f"use --{kind}-arg=--flag for dash-led values)")


def add_autoscale_arguments(parser: argparse.ArgumentParser) -> None:
    """--autoscale and the planner's policy flags (services.planner.flags)."""
    from services.planner.flags import add_policy_arguments

    parser.add_argument("--autoscale", action="store_true", default=_env_flag("PDSERVE_UP_AUTOSCALE"),
                        help="run the planner: it sizes the prefill and decode pools separately within "
                             "--min/--max-prefill/decode (env PDSERVE_UP_AUTOSCALE=1)")
    parser.add_argument("--profile", type=Path, default=_env("PDSERVE_PLANNER_PROFILE", None, Path),
                        help="the planner's profile JSON from `pdserve profile` (needed with --autoscale)")
    parser.add_argument("--planner-metrics-port", type=int, default=0,
                        help="the planner's /metrics port (default 0: a free one; -1: none)")
    add_policy_arguments(parser)


def _autoscaler(args: argparse.Namespace):
    """on_started hook for run_stack: start the planner on the stack, return its stop."""
    from services.launcher.autoscale_runner import AutoscaleRunner
    from services.planner.flags import config_from_args as planner_config

    config = planner_config(args)

    def start(stack):
        runner = AutoscaleRunner(stack, config, args.profile, args.planner_metrics_port)
        runner.start()
        return runner.stop
    return start


def _cpu_list(text: str) -> tuple[int, ...]:
    """`"0,1"` -> (0, 1); raises argparse's error for anything but comma-separated ids >= 0."""
    try:
        cpus = tuple(int(item) for item in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated CPU ids, got {text!r}") from None
    if any(cpu < 0 for cpu in cpus):
        raise argparse.ArgumentTypeError(f"CPU ids must be >= 0, got {text!r}")
    return cpus


def _device_args(args: argparse.Namespace) -> list[str]:
    """The instance flags of --device and --gpu-memory-utilization, when given."""
    device_args = [f"--device={args.device}"] if args.device else []
    if args.gpu_memory_utilization is not None:
        device_args.append(f"--gpu-memory-utilization={args.gpu_memory_utilization}")
    return device_args


def config_from_args(args: argparse.Namespace):
    """The StackConfig the parsed flags describe."""
    from services.launcher.config import StackConfig

    extra_args = {"gateway": args.gateway_args,
                  "instance": _parallel_args(args) + args.instance_args + _device_args(args),
                  "prefill": args.prefill_args, "decode": args.decode_args,
                  "colocated": args.decode_args}
    return StackConfig(
        num_prefill=args.num_prefill, num_decode=args.num_decode, colocated=args.colocated,
        model=args.model, dtype=args.dtype, num_threads=args.num_threads, deterministic=args.deterministic,
        host=args.host, gateway_port=args.gateway_port, redis_url=args.redis_url, run_dir=args.run_dir,
        ready_timeout_s=args.ready_timeout, stop_grace_s=args.stop_grace, extra_args=extra_args,
        prefill_cpus=args.prefill_cpus, decode_cpus=args.decode_cpus, gateway_cpus=args.gateway_cpus,
    )


def _parallel_args(args: argparse.Namespace) -> list[str]:
    """Instance flags for tensor/pipeline parallelism (none at the default of 1)."""
    flags = []
    if args.tensor_parallel_size != 1:
        flags += ["--tensor-parallel-size", str(args.tensor_parallel_size)]
    if args.pipeline_parallel_size != 1:
        flags += ["--pipeline-parallel-size", str(args.pipeline_parallel_size)]
    return flags


def run(args: argparse.Namespace) -> int:
    from services.launcher.run import run_stack
    from shared.errors import InvalidRequestError

    try:
        config = config_from_args(args)
    except ValueError as error:
        raise InvalidRequestError("up", str(error)) from error
    if not args.autoscale:
        return run_stack(config)
    if args.profile is None or args.colocated:
        raise InvalidRequestError("autoscale", "--autoscale needs --profile (from `pdserve profile`) "
                                               "and prefill/decode pools (not --colocated)")
    # A drained instance gets this long to finish its requests after SIGTERM.
    config.extra_args["instance"] = ["--shutdown-grace-s", "120", *config.extra_args["instance"]]
    return run_stack(config, on_started=_autoscaler(args))
