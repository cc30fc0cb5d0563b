"""A registry per service (never prometheus_client's global one: tests run several services in
one process), with the process collectors (memory, CPU, open files, GC)."""

from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

__all__ = ["CONTENT_TYPE_LATEST", "new_registry", "render"]


def new_registry() -> CollectorRegistry:
    registry = CollectorRegistry()
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    return registry


def render(registry: CollectorRegistry) -> bytes:
    """The text exposition format (what `GET /metrics` returns)."""
    return generate_latest(registry)
