"""The --ready-file: JSON a launcher waits for to learn where an instance listens (gRPC, UCX,
/metrics)."""

import json
import os
from pathlib import Path


def write_ready_file(path: str, grpc_address: str, ucx_address: str, instance_id: str, role: str,
                     metrics_address: str = "") -> None:
    """Write atomically (temp file + rename) so a reader never sees half a file.
    `metrics_address` is "" when the instance serves no /metrics."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    content = {"grpc_address": grpc_address, "ucx_address": ucx_address, "instance_id": instance_id, "role": role,
               "metrics_address": metrics_address}
    temporary = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    temporary.write_text(json.dumps(content) + "\n")
    os.replace(temporary, target)
