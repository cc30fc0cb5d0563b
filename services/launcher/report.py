"""The human-readable summary `pdserve up` prints once the stack is SERVING."""

from services.launcher.stack import LocalStack


def describe(stack: LocalStack) -> str:
    """Where to send requests, then one line per child (pid, address, log file, and its
    Prometheus /metrics URL when its ready file names one)."""
    gateway = stack.gateway_address
    lines = [
        f"pdserve stack is up: send requests to the gateway at {gateway} (gRPC, pdserve.v1.Gateway)",
        *_http_lines(stack.ready_info.get("gateway", {}).get("http_address")),
        f"  try:   pdserve generate \"Hello\" --gateway {gateway}",
        f"  state: pdserve status --redis-url {stack.redis_url}",
        f"  redis: {stack.redis_url}",
    ]
    for child in stack.children():
        address = stack.addresses.get(child.name, stack.redis_url if child.role == "redis" else "")
        lines.append(f"  {child.name:<12} pid {child.pid:<8} {address:<22} log {child.log_path}"
                     + _metrics_part(stack.ready_info.get(child.name, {}).get("metrics_address")))
    lines.append("Press Ctrl-C to stop everything.")
    return "\n".join(lines)


def _metrics_part(metrics_address: str | None) -> str:
    return f"  metrics http://{metrics_address}/metrics" if metrics_address else ""


def _http_lines(http_address: str | None) -> list[str]:
    if not http_address:
        return []
    return [f"  OpenAI-compatible HTTP API: http://{http_address}/v1 (health: http://{http_address}/health)"]
