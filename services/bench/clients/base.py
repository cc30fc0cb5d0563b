"""The client interface the runner drives, and the factory behind `--backend`.

A client sends one BenchPrompt as a streaming request and fills a RequestRecord: the arrival
time of every message that carries tokens, the stream's end, usage, or the error. It never
raises for a failed request: the error goes into the record.
"""

from dataclasses import dataclass
from typing import Protocol

from services.bench.datasets import BenchPrompt
from services.bench.records import RequestRecord

BACKENDS = ("pdserve-grpc", "openai", "openai-chat")


@dataclass(frozen=True)
class ClientOptions:
    """Where to send and the sampling every request gets (greedy by default)."""

    backend: str
    # gRPC: "host:port"; OpenAI: a base URL such as http://127.0.0.1:8000 (with or without /v1).
    target: str
    model: str = ""
    temperature: float = 0.0
    ignore_eos: bool = True
    timeout_s: float = 600.0


class BenchClient(Protocol):
    async def send(self, prompt: BenchPrompt, record: RequestRecord) -> None:
        """Stream one request; times are taken with time.perf_counter() from the call."""

    async def close(self) -> None:
        """Release connections; called once after the last request."""


def make_client(options: ClientOptions) -> BenchClient:
    """The client for `options.backend`; called once per benchmark run."""
    if options.backend == "pdserve-grpc":
        from services.bench.clients.grpc_client import GrpcGatewayClient

        return GrpcGatewayClient(options)
    if options.backend in ("openai", "openai-chat"):
        from services.bench.clients.openai_client import OpenAIStreamClient

        return OpenAIStreamClient(options, is_chat=options.backend == "openai-chat")
    raise ValueError(f"unknown backend {options.backend!r} (use one of {', '.join(BACKENDS)})")
