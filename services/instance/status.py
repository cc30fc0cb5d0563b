"""GetStatus: the engine's status (one snapshot taken between steps) as the wire message;
role handlers then add theirs (lease expiries)."""

from shared.engine_api.client import EngineStatus
from shared.pb.pdserve.v1 import instance_pb2 as pb


def status_to_proto(status: EngineStatus) -> pb.InstanceStatus:
    load, kv = status.load, status.kv_transfer
    return pb.InstanceStatus(
        num_waiting=load.num_waiting, num_running=load.num_running, num_reserved=load.num_reserved,
        num_held=status.num_held, num_free_blocks=load.num_free_blocks, num_total_blocks=load.num_total_blocks,
        num_prompt_tokens_computed=status.num_prompt_tokens_computed,
        num_cached_prompt_tokens=status.num_cached_prompt_tokens,
        num_generation_tokens=status.num_generation_tokens,
        num_requests_finished=status.num_requests_finished,
        kv_bytes_transferred=kv.sent.total_bytes + kv.received.total_bytes,
        kv_transfer_seconds=kv.sent.total_seconds + kv.received.total_seconds,
    )
