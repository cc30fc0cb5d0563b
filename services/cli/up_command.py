"""`pdserve up`: run a local stack (Redis, prefill, decode or colocated instances, a gateway)
as separate processes on loopback until Ctrl-C or SIGTERM.

Every setting is a flag, an environment variable (shown in --help) and a key of the optional
`--config` TOML file; flags win over variables, which win over the file.
"""

import argparse
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, field_validator
from pydantic_settings import NoDecode, SettingsConfigDict

from shared.engine_args import EngineArgs

from services.settings.flags import (MANY_VALUES, ONE_VALUE, add_config_flag, add_settings_flags, flag_name,
                                    settings_from_args)
from services.settings.service_settings import ServiceSettings, comma_separated, settings_group

CPU_LAYOUTS = ("auto", "disjoint", "shared")  # as services.launcher.config (a test holds them equal)
CpuList = Annotated[tuple[int, ...] | None, NoDecode]
# The engine's settings `pdserve up` takes and passes on to every instance: fields of EngineArgs
# (their types, checks and descriptions), read from the instances' own variables (PDSERVE_MODEL, ...;
# PDSERVE_UP_GPU_MEMORY_UTILIZATION, as before); passed on when they differ from the engine's default.
ENGINE_SETTINGS = ("model", "dtype", "device", "gpu_memory_utilization", "num_threads", "deterministic",
                   "tensor_parallel_size", "pipeline_parallel_size", "kv_events_endpoint", "kv_events_topic",
                   "kv_events_format")
# model, dtype, num_threads and deterministic go through StackConfig (the launcher passes them on);
# these two groups as instance flags, before and after the --instance-arg ones.
PARALLEL_SETTINGS = ("tensor_parallel_size", "pipeline_parallel_size")
DEVICE_SETTINGS = ("device", "gpu_memory_utilization")
# kv_events_endpoint goes through StackConfig (instance k gets its port plus k); these as flags.
KV_EVENTS_SETTINGS = ("kv_events_topic", "kv_events_format")


class UpSettings(ServiceSettings):
    """`pdserve up`'s settings: PDSERVE_UP_* variables, except those an instance reads too
    (PDSERVE_MODEL, PDSERVE_DTYPE, ...: `engine`'s), which the stack and its instances share."""

    model_config = SettingsConfigDict(env_prefix="PDSERVE_UP_")

    num_prefill: int = Field(1, description="prefill instances")
    num_decode: int = Field(1, description="decode (or colocated) instances")
    colocated: bool = Field(False, description="run --num-decode colocated instances and no prefill ones")
    host: str = Field("127.0.0.1", description="address every service binds")
    gateway_port: int = Field(50051, description="gateway gRPC port, 0 = any free one")
    engine: EngineArgs = Field(
        default_factory=EngineArgs, description="every instance's engine settings (shared.engine_args)",
        json_schema_extra=settings_group(ENGINE_SETTINGS,
                                         env_names={"gpu_memory_utilization": "PDSERVE_UP_GPU_MEMORY_UTILIZATION"}))
    redis_url: str | None = Field(None, description="use this Redis instead of starting redis-server")
    run_dir: Path | None = Field(None, description="folder for logs and ready files (none: a new temp folder)")
    ready_timeout: float = Field(600.0, description="seconds to wait for every service to be SERVING")
    stop_grace: float = Field(30.0, description="seconds between SIGTERM (instances and gateway drain) and "
                                                "SIGKILL when stopping")
    prefill_cpus: CpuList = Field(None, description="pin every prefill process to these CPU ids, e.g. 0 or 0,1 "
                                                    "(none: not pinned)", json_schema_extra=ONE_VALUE)
    decode_cpus: CpuList = Field(None, description="pin every decode (or colocated) process to these CPU ids "
                                                   "(none: not pinned)", json_schema_extra=ONE_VALUE)
    gateway_cpus: CpuList = Field(None, description="pin the gateway and the stack's redis-server to these CPU "
                                                    "ids, e.g. the prefill's to keep decode cores for decoding "
                                                    "(none: not pinned)", json_schema_extra=ONE_VALUE)
    cpu_layout: Literal[CPU_LAYOUTS] = Field(
        "auto", validation_alias="PDSERVE_CPU_LAYOUT",
        description="instances without CPU lists: disjoint (each its own CPUs), shared (all over every CPU, "
                    "threads adapting to load) or auto (shared where bf16 matmuls run in hardware, "
                    "disjoint elsewhere; docs/performance.md)")
    lora_modules: Annotated[tuple[str, ...], NoDecode] = Field(
        (), validation_alias="PDSERVE_LORA_MODULES", json_schema_extra=MANY_VALUES,
        description="LoRA adapters every instance serves and the gateway accepts as `model`, each name=path of a "
                    "peft folder (--max-loras, --max-lora-rank go with --instance-arg)")
    autoscale: bool = Field(False, description="run the planner: it sizes the prefill and decode pools "
                                               "separately within --min/--max-prefill/decode")
    profile: Path | None = Field(None, validation_alias="PDSERVE_PLANNER_PROFILE",
                                 description="the planner's profile JSON from `pdserve profile` (needed "
                                             "with --autoscale)")
    planner_metrics_port: int = Field(0, description="the planner's /metrics port (0: a free one; -1: none)")
    otlp_traces_endpoint: str = Field("", validation_alias="PDSERVE_OTLP_TRACES_ENDPOINT",
                                      description="every service exports OpenTelemetry traces over OTLP/gRPC "
                                                  "to this collector ('' = tracing off)")
    otlp_traces_sample_ratio: float = Field(1.0, ge=0, le=1, validation_alias="PDSERVE_OTLP_TRACES_SAMPLE_RATIO",
                                            description="share of new traces recorded")

    @field_validator("lora_modules", mode="before")
    @classmethod
    def _split_modules(cls, value):
        return comma_separated(value)

    @field_validator("prefill_cpus", "decode_cpus", "gateway_cpus", mode="before")
    @classmethod
    def _cpu_list(cls, value):
        """`"0,1"` -> (0, 1); anything but comma-separated ids >= 0 is refused."""
        if not isinstance(value, str):
            return value
        try:
            cpus = tuple(int(item) for item in value.split(","))
        except ValueError:
            raise ValueError("expected comma-separated CPU ids") from None
        if any(cpu < 0 for cpu in cpus):
            raise ValueError("CPU ids must be >= 0")
        return cpus


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
    """The stack's settings as flags (each also a variable and a --config key), plus the
    pass-through arguments of its children."""
    add_config_flag(parser)
    add_settings_flags(parser, UpSettings, skip=("autoscale", "profile", "planner_metrics_port"))
    for kind in ("gateway", "instance", "prefill", "decode"):
        parser.add_argument(f"--{kind}-arg", dest=f"{kind}_args", action="append", default=[],
                            metavar="ARG", help=f"extra argument for every {kind} process (repeatable; "
                                                f"use --{kind}-arg=--flag for dash-led values)")


def add_autoscale_arguments(parser: argparse.ArgumentParser) -> None:
    """--autoscale, --profile, --planner-metrics-port and the planner's policy flags."""
    from services.planner.flags import add_policy_arguments

    add_settings_flags(parser, UpSettings, only=("autoscale", "profile", "planner_metrics_port"))
    add_policy_arguments(parser)


def up_settings(args: argparse.Namespace) -> UpSettings:
    """Flags > variables > --config file > defaults; raises ConfigurationError naming the setting."""
    return settings_from_args(args, UpSettings)


def _autoscaler(args: argparse.Namespace, settings: UpSettings):
    """on_started hook for run_stack: start the planner on the stack, return its stop."""
    from services.launcher.autoscale_runner import AutoscaleRunner
    from services.planner.flags import config_from_args as planner_config

    config = planner_config(args)

    def start(stack):
        runner = AutoscaleRunner(stack, config, settings.profile, settings.planner_metrics_port)
        runner.start()
        return runner.stop
    return start


def config_from_args(args: argparse.Namespace):
    """The StackConfig the parsed flags (and variables, and --config file) describe."""
    from services.launcher.config import StackConfig

    settings = up_settings(args)
    engine = settings.engine
    lora_args = ["--lora-modules", *settings.lora_modules] if settings.lora_modules else []
    extra_args = {"gateway": lora_args + args.gateway_args,
                  "instance": (passed_on_flags(engine, PARALLEL_SETTINGS) + lora_args + args.instance_args
                               + passed_on_flags(engine, DEVICE_SETTINGS) + passed_on_flags(engine, KV_EVENTS_SETTINGS)),
                  "prefill": args.prefill_args, "decode": args.decode_args,
                  "colocated": args.decode_args}
    return StackConfig(
        num_prefill=settings.num_prefill, num_decode=settings.num_decode, colocated=settings.colocated,
        model=engine.model or None, dtype=engine.dtype, num_threads=engine.num_threads or None,
        deterministic=engine.deterministic, host=settings.host,
        gateway_port=settings.gateway_port, redis_url=settings.redis_url, run_dir=settings.run_dir,
        ready_timeout_s=settings.ready_timeout, stop_grace_s=settings.stop_grace, extra_args=extra_args,
        prefill_cpus=settings.prefill_cpus, decode_cpus=settings.decode_cpus, gateway_cpus=settings.gateway_cpus,
        cpu_layout=settings.cpu_layout,
        otlp_traces_endpoint=settings.otlp_traces_endpoint,
        otlp_traces_sample_ratio=settings.otlp_traces_sample_ratio,
        kv_events_endpoint=engine.kv_events_endpoint,
    )


def passed_on_flags(engine: EngineArgs, names: tuple[str, ...]) -> list[str]:
    """The instance flags of the engine settings `names` that differ from the engine's default."""
    default = EngineArgs()
    return [f"{flag_name(name)}={getattr(engine, name)}" for name in names
            if getattr(engine, name) != getattr(default, name)]


def run(args: argparse.Namespace) -> int:
    from services.launcher.run import run_stack
    from shared.errors import ConfigurationError

    config = config_from_args(args)
    settings = up_settings(args)
    if not settings.autoscale:
        return run_stack(config)
    if settings.profile is None or settings.colocated:
        raise ConfigurationError("autoscale", "--autoscale needs --profile (from `pdserve profile`) "
                                              "and prefill/decode pools (not --colocated)")
    # A drained instance gets this long to finish its requests after SIGTERM.
    config.extra_args["instance"] = ["--shutdown-grace-s", "120", *config.extra_args["instance"]]
    return run_stack(config, on_started=_autoscaler(args, settings))
