"""Peer reuse, the gateway's part: name the instance a prefill instance may pull a prompt's
leading blocks from (PrefillRequest.peer_source), when another live instance holds more of
them in its pool than the prefill instance can use locally (its pool and its host's KV
tiers). The holder may be another prefill instance, or the decode instance that generated
the conversation's previous turn. Whether to pull is the prefill instance's choice, by
measured cost; a holder that is gone by then only means the prompt is computed.
"""

from collections.abc import Iterable

from shared.pb.pdserve.v1 import instance_pb2

from services.gateway.pairing import can_pair
from services.gateway.router import Candidate


def best_holder(target: Candidate, candidates: Iterable[Candidate]) -> Candidate | None:
    """The live, unsuspected instance with the most leading blocks in its pool, beyond what
    `target` holds locally; ties go to the least loaded. None when nobody holds more."""
    holders = [c for c in candidates
               if c.instance_id != target.instance_id and not c.is_suspect and c.prefix_blocks > target.local_blocks
               and can_pair(c, target)]
    if not holders:
        return None
    return min(holders, key=lambda c: (-c.prefix_blocks, c.queue_depth + c.num_running, c.instance_id))


def add_peer_source(message: instance_pb2.PrefillRequest, target: Candidate, candidates: Iterable[Candidate]) -> None:
    """Set (or clear) `message.peer_source` for a Prefill sent to `target`."""
    message.ClearField("peer_source")
    holder = best_holder(target, candidates)
    if holder is not None:
        message.peer_source.CopyFrom(instance_pb2.PeerSource(
            instance_id=holder.instance_id, grpc_address=holder.grpc_address, num_blocks=holder.prefix_blocks,
            num_local_blocks=target.local_blocks))
