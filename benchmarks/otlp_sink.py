"""An OTLP/gRPC trace receiver that counts what it is sent and keeps nothing: the collector the
tracing-cost benchmark (benchmarks/tracing_cost.py) points its traced stacks at, in a process of
its own so that decoding the exports never competes with the load generator's event loop.

    python -m benchmarks.otlp_sink          prints "endpoint http://127.0.0.1:PORT", then, on
                                            each line read from stdin, "spans N" (N so far);
                                            exits at the end of stdin
"""

import sys
import threading
from concurrent import futures

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

HOST = "127.0.0.1"


class CountingTraceService(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self):
        self._lock = threading.Lock()
        self.num_spans = 0

    def Export(self, request, context):
        count = sum(len(scope.spans) for resource in request.resource_spans for scope in resource.scope_spans)
        with self._lock:
            self.num_spans += count
        return trace_service_pb2.ExportTraceServiceResponse()


def main() -> int:
    service = CountingTraceService()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(service, server)
    port = server.add_insecure_port(f"{HOST}:0")
    server.start()
    print(f"endpoint http://{HOST}:{port}", flush=True)
    for _ in sys.stdin:
        print(f"spans {service.num_spans}", flush=True)
    server.stop(grace=1.0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
