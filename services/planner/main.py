"""`pdserve serve planner` (`python -m services.planner`): run the planner until SIGINT or
SIGTERM. It reads the gateways' /metrics and the instances' Redis heartbeats, decides the
prefill and decode replica counts separately, exports them on --metrics-port, and applies
them with --actuator (log: decide and export only; kubernetes: scale two Deployments)."""

import argparse
import asyncio
import logging
import os
import signal
from collections.abc import Sequence

import redis.asyncio

from shared.cluster.instances import InstanceRegistry
from shared.cluster.keys import ClusterNamespace
from shared.logging_setup import configure_logging

from services.planner.actuator import Actuator, LogActuator
from services.planner.flags import add_policy_arguments, config_from_args
from services.planner.metrics import PlannerMetrics
from services.planner.observer import Observer
from services.planner.planner import Planner
from services.planner.profile_data import PerfProfile
from services.planner.service import PlannerService

logger = logging.getLogger("services.planner")


def _env(name: str, default: str | None = None) -> str | None:
    return os.environ.get(f"PDSERVE_PLANNER_{name}", default)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pdserve serve planner", description=__doc__)
    parser.add_argument("--profile", default=_env("PROFILE"), required=_env("PROFILE") is None,
                        help="profile JSON from `pdserve profile` (env PDSERVE_PLANNER_PROFILE)")
    parser.add_argument("--redis-url", default=os.environ.get("PDSERVE_REDIS_URL", "redis://127.0.0.1:6379/0"))
    parser.add_argument("--deployment", default=os.environ.get("PDSERVE_DEPLOYMENT", "default"))
    parser.add_argument("--model-key", default=_env("MODEL_KEY"),
                        help="the Redis namespace's model (default: the served model folder's name)")
    parser.add_argument("--model", default=os.environ.get("PDSERVE_MODEL"), help="to derive --model-key")
    parser.add_argument("--gateway-metrics-url", action="append", default=(_env("GATEWAY_METRICS_URLS") or "").split()
                        or [], help="a gateway's /metrics URL (repeatable; env: space-separated)")
    parser.add_argument("--prefill-metrics-url", action="append",
                        default=(_env("PREFILL_METRICS_URLS") or "").split() or [],
                        help="a prefill instance's /metrics URL, for the prefix-hit ratio that sizes the "
                             "prefill pool (repeatable; env: space-separated; none: no hits assumed)")
    parser.add_argument("--metrics-host", default=_env("METRICS_HOST", "127.0.0.1"))
    parser.add_argument("--metrics-port", type=int, default=int(_env("METRICS_PORT", "-1")),
                        help="Prometheus /metrics port (0 = a free one; -1 = none)")
    parser.add_argument("--actuator", choices=("log", "kubernetes"), default=_env("ACTUATOR", "log"))
    parser.add_argument("--k8s-namespace", default=_env("K8S_NAMESPACE", "pdserve"))
    parser.add_argument("--k8s-prefill-deployment", default=_env("K8S_PREFILL_DEPLOYMENT", "pdserve-prefill"))
    parser.add_argument("--k8s-decode-deployment", default=_env("K8S_DECODE_DEPLOYMENT", "pdserve-decode"))
    add_policy_arguments(parser)
    return parser


def model_key_of(args: argparse.Namespace) -> str:
    if args.model_key:
        return args.model_key
    from services.gateway.served_model import model_folder
    return model_folder(args.model).name


def build_actuator(args: argparse.Namespace) -> Actuator:
    if args.actuator == "kubernetes":
        from services.planner.k8s_actuator import KubernetesActuator
        return KubernetesActuator.in_cluster(args.k8s_namespace, {"prefill": args.k8s_prefill_deployment,
                                                                  "decode": args.k8s_decode_deployment})
    return LogActuator(args.min_prefill, args.min_decode)


async def serve(args: argparse.Namespace) -> int:
    config = config_from_args(args)
    actuator = build_actuator(args)
    client = redis.asyncio.Redis.from_url(args.redis_url, socket_timeout=2.0, socket_connect_timeout=2.0)
    registry = InstanceRegistry(client, ClusterNamespace(args.deployment, model_key_of(args)))
    planner = Planner(config, PerfProfile.load(args.profile), actuator.replicas("prefill"), actuator.replicas("decode"))
    service = PlannerService(planner, Observer(registry, args.gateway_metrics_url,
                                                      prefill_metrics_urls=args.prefill_metrics_url), actuator)
    if args.metrics_port >= 0:
        service.metrics.server.start(args.metrics_host, args.metrics_port)
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
    args = build_parser().parse_args(argv)
    configure_logging(os.environ.get("PDSERVE_LOG_LEVEL", "INFO"), os.environ.get("PDSERVE_LOG_FORMAT", "text"))
    return asyncio.run(serve(args))

