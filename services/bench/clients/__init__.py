"""Streaming clients of the benchmark, one per `--backend`; `make_client` picks one."""

from services.bench.clients.base import BACKENDS, BenchClient, ClientOptions, make_client

__all__ = ["BACKENDS", "BenchClient", "ClientOptions", "make_client"]
