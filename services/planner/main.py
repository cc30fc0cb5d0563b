"""`pdserve serve planner` (`python -m services.planner`): run the planner until SIGINT or
SIGTERM. It reads the gateways' /metrics and the instances' Redis heartbeats, decides the
prefill and decode replica counts separately, exports them on --metrics-port, and applies
them with --actuator (log: decide and export only; kubernetes: scale two Deployments; docker:
start and stop containers of two Docker Compose services)."""

import argparse
import asyncio
import logging
import signal
import sys
from collections.abc import Sequence
from typing import Annotated, Literal

from pydantic import Field, field_validator
from pydantic_settings import NoDecode, SettingsConfigDict

from shared.cluster.instances import InstanceRegistry
from shared.cluster.keys import ClusterNamespace
from shared.errors import ConfigurationError
from shared.logging_setup import LOG_FORMATS, configure_logging

from services.settings.redis_client import RedisClientSettings, redis_client
from services.settings.flags import add_config_flag, add_settings_flags, flag_name, settings_from_args
from services.planner.actuator import Actuator, LogActuator
from services.planner.flags import PLANNER_ENV_PREFIX, add_policy_arguments, config_from_args
from services.planner.config import PlannerConfig
from services.planner.metrics import PlannerMetrics
from services.planner.observer import Observer
from services.planner.planner import Planner
from services.cost_model.perf_profile import PerfProfile
from services.planner.service import PlannerService

logger = logging.getLogger("services.planner")


class PlannerServiceSettings(RedisClientSettings):
    """Where the planner reads and acts; PDSERVE_PLANNER_* variables, except the settings every
    service shares (PDSERVE_REDIS_URL, PDSERVE_DEPLOYMENT, PDSERVE_MODEL, PDSERVE_LOG_*)."""

    model_config = SettingsConfigDict(env_prefix=PLANNER_ENV_PREFIX)

    profile: str = Field("", description="profile JSON from `pdserve profile` (required)")
    redis_url: str = Field("redis://127.0.0.1:6379/0", validation_alias="PDSERVE_REDIS_URL",
                           description="Redis holding the instances' heartbeats")
    deployment: str = Field("default", validation_alias="PDSERVE_DEPLOYMENT", description="deployment name")
    model_key: str = Field("", description="the Redis namespace's model ('': the served model folder's name)")
    model: str = Field("", validation_alias="PDSERVE_MODEL", description="to derive --model-key")
    gateway_metrics_url: Annotated[tuple[str, ...], NoDecode] = Field(
        (), validation_alias="PDSERVE_PLANNER_GATEWAY_METRICS_URLS",
        description="a gateway's /metrics URL (repeatable; the variable is space separated)")
    prefill_metrics_url: Annotated[tuple[str, ...], NoDecode] = Field(
        (), validation_alias="PDSERVE_PLANNER_PREFILL_METRICS_URLS",
        description="a prefill instance's /metrics URL, for the prefix-hit ratio that sizes the prefill pool "
                    "(repeatable; the variable is space separated; none: no hits assumed)")
    metrics_host: str = Field("127.0.0.1", description="address of the planner's /metrics")
    metrics_port: int = Field(-1, ge=-1, le=65535, description="Prometheus /metrics port (0 = a free one; -1 = none)")
    actuator: Literal["log", "kubernetes", "docker"] = Field(
        "log", description="log: decide and export only; kubernetes: scale two Deployments; docker: start and "
                           "stop containers of two Docker Compose services (needs the Docker socket)")
    k8s_namespace: str = Field("pdserve", description="namespace of the Deployments")
    k8s_prefill_deployment: str = Field("pdserve-prefill", description="the prefill Deployment")
    k8s_decode_deployment: str = Field("pdserve-decode", description="the decode Deployment")
    docker_socket: str = Field("/var/run/docker.sock", description="the Docker Engine API's Unix socket")
    docker_project: str = Field("", description="the compose project ('': the one of the container the "
                                                "planner runs in)")
    docker_prefill_service: str = Field("prefill", description="the prefill compose service")
    docker_decode_service: str = Field("decode", description="the decode compose service")
    log_level: str = Field("INFO", validation_alias="PDSERVE_LOG_LEVEL", description="Python logging level")
    log_format: Literal[LOG_FORMATS] = Field("text", validation_alias="PDSERVE_LOG_FORMAT",
                                             description="log lines as text or one JSON object each")

    @field_validator("gateway_metrics_url", "prefill_metrics_url", mode="before")
    @classmethod
    def _split_urls(cls, value):
        return tuple(value.split()) if isinstance(value, str) else value

    @field_validator("profile")
    @classmethod
    def _profile_given(cls, value: str) -> str:
        if not value:
            raise ConfigurationError("profile", "is required: a profile JSON from `pdserve profile`")
        return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pdserve serve planner", description=__doc__)
    add_config_flag(parser)
    add_settings_flags(parser, PlannerServiceSettings)
    add_policy_arguments(parser)
    return parser


def model_key_of(settings: PlannerServiceSettings) -> str:
    if settings.model_key:
        return settings.model_key
    from shared.model.default_model import model_folder
    return model_folder(settings.model or None).name


def build_actuator(settings: PlannerServiceSettings, config: PlannerConfig) -> Actuator:
    if settings.actuator == "kubernetes":
        from services.planner.k8s_actuator import KubernetesActuator
        return KubernetesActuator.in_cluster(settings.k8s_namespace, {"prefill": settings.k8s_prefill_deployment,
                                                                  "decode": settings.k8s_decode_deployment})
    if settings.actuator == "docker":
        return docker_actuator(settings)
    return LogActuator(config.prefill.min_replicas, config.decode.min_replicas)


def docker_actuator(settings: PlannerServiceSettings) -> Actuator:
    """Raises ConfigurationError when the socket cannot be reached or the project not found."""
    from services.planner.docker_actuator import DockerActuator
    from services.planner.docker_engine import DockerEngineError

    try:
        return DockerActuator.for_this_container(settings.docker_socket, settings.docker_project, {
            "prefill": settings.docker_prefill_service, "decode": settings.docker_decode_service})
    except OSError as error:
        raise ConfigurationError("docker_socket", f"cannot reach the Docker engine at {settings.docker_socket}: "
                                                  f"{error}") from None
    except DockerEngineError as error:
        raise ConfigurationError("docker_project", str(error)) from None


async def serve(settings: PlannerServiceSettings, config: PlannerConfig) -> int:
    actuator = build_actuator(settings, config)
    client = redis_client(settings, settings.redis_url)
    registry = InstanceRegistry(client, ClusterNamespace(settings.deployment, model_key_of(settings)))
    planner = Planner(config, PerfProfile.load(settings.profile), actuator.replicas("prefill"), actuator.replicas("decode"))
    service = PlannerService(planner, Observer(registry, settings.gateway_metrics_url,
                                               prefill_metrics_urls=settings.prefill_metrics_url), actuator)
    if settings.metrics_port >= 0:
        service.metrics.server.start(settings.metrics_host, settings.metrics_port)
    stop = asyncio.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        asyncio.get_running_loop().add_signal_handler(signum, stop.set)
    try:
        await service.run(stop)
    finally:
        service.metrics.server.stop()
        await client.aclose()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """0 after a signal; 2 for a bad setting (named on stderr)."""
    args = build_parser().parse_args(argv)
    try:
        settings = settings_from_args(args, PlannerServiceSettings)
        config = config_from_args(args)
    except ConfigurationError as error:
        print(f"planner: error: {flag_name(error.field)}: {error.message}", file=sys.stderr)
        return 2
    configure_logging(settings.log_level, settings.log_format)
    try:
        return asyncio.run(serve(settings, config))
    except ConfigurationError as error:
        print(f"planner: error: {flag_name(error.field)}: {error.message}", file=sys.stderr)
        return 2
