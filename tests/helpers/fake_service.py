"""A stand-in service for the launcher's unit tests: `python -m tests.helpers.fake_service`.

Accepts the real services' flags (ignoring all but --host, --port/--grpc-port, --ready-file,
--instance-id, --metrics-port), serves only the standard gRPC health service (and, with
--metrics-port, prometheus_client's process metrics), writes the ready file, and exits 0 on
SIGTERM. Misbehaviour is chosen per instance with FAKE_SERVICE_MODE_<NAME> (name
upper-cased, '-' as '_'), else FAKE_SERVICE_MODE:
  ok             behave
  exit_at_start  exit 3 before binding
  not_serving    bind and write the ready file, never report SERVING
  die_after      exit 4 one second after becoming ready
  ignore_term    ignore SIGTERM (the launcher must SIGKILL it)
  unregistered   name a Redis namespace in the ready file, as instances do, and never register there
"""

import argparse
import json
import os
import signal
import sys
import threading
import time
from concurrent import futures

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from prometheus_client import start_http_server


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", "--grpc-port", dest="port", type=int, default=0)
    parser.add_argument("--ready-file", required=True)
    parser.add_argument("--instance-id", default="gateway")
    parser.add_argument("--metrics-port", type=int, default=-1)
    args, _ = parser.parse_known_args(argv)
    return args


def mode_of(name: str) -> str:
    specific = os.environ.get(f"FAKE_SERVICE_MODE_{name.upper().replace('-', '_')}")
    return specific or os.environ.get("FAKE_SERVICE_MODE", "ok")


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    mode = mode_of(args.instance_id)
    if mode == "exit_at_start":
        return 3
    if mode == "ignore_term":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    else:  # taken by sigwait below: no handler, so no lock to deadlock on (see services.launcher.stop_signals)
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # before any thread starts
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port(f"{args.host}:{args.port}")
    server.start()
    status = health_pb2.HealthCheckResponse
    servicer.set("", status.NOT_SERVING if mode == "not_serving" else status.SERVING)
    ready_content = {"grpc_address": f"{args.host}:{port}", "pid": os.getpid()}
    if mode == "unregistered":
        ready_content.update(instance_id=args.instance_id, deployment="default", model="fake-model")
    if args.metrics_port >= 0:
        metrics_server, _ = start_http_server(args.metrics_port, addr=args.host)
        ready_content["metrics_address"] = f"{args.host}:{metrics_server.server_port}"
    with open(args.ready_file, "w") as ready:
        json.dump(ready_content, ready)
    if mode == "die_after":
        time.sleep(1.0)
        return 4
    if mode == "ignore_term":
        threading.Event().wait()  # until SIGKILL
    signal.sigwait({signal.SIGTERM})
    server.stop(0)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
