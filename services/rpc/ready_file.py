"""The --ready-file: JSON a launcher (or a container's health probe) reads to learn where a
service listens (gRPC, UCX, /metrics), and where an instance registers in Redis."""

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the container health probe reads ready files: it imports nothing of shared/
    from shared.cluster.keys import ClusterNamespace


def write_ready_file(path: str, grpc_address: str, ucx_address: str, instance_id: str, role: str,
                     metrics_address: str = "", openai_address: str = "",
                     registered_in: "ClusterNamespace | None" = None) -> None:
    """Write atomically (temp file + rename) so a reader never sees half a file.
    `metrics_address` is "" when the instance serves no /metrics, `openai_address` when it
    serves no OpenAI HTTP API (--openai-port); `registered_in` (as "deployment" and "model") is
    the namespace it registers in, where a launcher waits for it."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    content = {"grpc_address": grpc_address, "ucx_address": ucx_address, "instance_id": instance_id, "role": role,
               "metrics_address": metrics_address, "openai_address": openai_address}
    if registered_in is not None:
        content.update(deployment=registered_in.deployment, model=registered_in.model)
    temporary = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    temporary.write_text(json.dumps(content) + "\n")
    os.replace(temporary, target)


def read_ready_file(path: Path) -> dict | None:
    """The ready file's JSON object, or None while it is missing or half-written."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def grpc_address_in(ready: dict, default_host: str = "127.0.0.1") -> str | None:
    """The bound gRPC address ("host:port") a ready file announces (`grpc_address`, or
    `address`, or `host` + `grpc_port`/`port`); None when it names none."""
    for key in ("grpc_address", "address"):
        if isinstance(ready.get(key), str) and ready[key]:
            return ready[key]
    for key in ("grpc_port", "port"):
        if isinstance(ready.get(key), int) and ready[key] > 0:
            return f"{ready.get('host') or default_host}:{ready[key]}"
    return None
