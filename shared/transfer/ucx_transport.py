"""KV block transfer over UCX (ucxx): the public entry point for prefill and decode services.

    from shared.transfer.ucx_transport import KVReceiver, KVSender

Protocol, per connection and one transfer at a time (messages in proto/pdserve/v1/kv_transfer.proto):
  1. sender -> receiver: KVTransferHeader, one frame (shared.transfer.framing)
  2. sender -> receiver: the payload, one ucxx message of header.payload_bytes raw bytes on its
     own tag, sent right behind the header without waiting (saves a round trip)
  3. receiver -> sender: KVTransferAck COMPLETED once verified and written, or REJECTED with
     the field at fault (unknown request id, layout mismatch, checksum, ...)
A rejected transfer writes nothing: the receiver receives its payload into scratch memory and
drops it, and both sides then close that connection (the sender connects anew next time).

Concurrency: the sender gives every transfer in flight a connection of its own (reused per
destination once idle), so concurrent transfers to one receiver never share a connection.
UCX environment defaults (UCX_TLS=tcp,self) are applied by shared.transfer.ucx_env.
"""

from shared.transfer.errors import KVTransferError, KVTransferRejected
from shared.transfer.stats import TransferCounters, TransferResult
from shared.transfer.ucx_receiver import KVReceiver
from shared.transfer.ucx_sender import KVSender, parse_address

__all__ = [
    "KVReceiver", "KVSender", "KVTransferError", "KVTransferRejected", "TransferCounters",
    "TransferResult", "parse_address",
]
