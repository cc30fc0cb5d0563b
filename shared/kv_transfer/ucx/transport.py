"""KV block transfer over UCX (ucxx): the public entry point for prefill and decode services.

    from shared.kv_transfer.ucx.transport import KVReceiver, KVSender

Protocol, per connection and one transfer at a time (messages in proto/pdserve/v1/kv_transfer.proto):
  1. sender -> receiver: KVTransferHeader, one frame (shared.kv_transfer.ucx.framing)
  2. sender -> receiver: the payload in chunks of whole rows (shared.kv_transfer.ucx.chunks), one
     ucxx message each on their own tag, each optionally ending with its CRC-32; sent right
     behind the header without waiting (no round trip). The sender gathers chunk i + 1 while
     chunk i is on the wire; the receiver writes chunk i into its cache while i + 1 arrives.
  3. receiver -> sender: KVTransferAck COMPLETED once every chunk is verified and written, or
     REJECTED with the field at fault (unknown request id, layout mismatch, chunk_crc32, ...)
A header rejected up front writes nothing: the receiver drops its payload. A chunk that fails
its checksum stops the transfer; earlier chunks may already be in the destination blocks, which
belong to that request alone (the decode side frees them or has them filled by a retry). Either
way both sides then close that connection (the sender connects anew next time).

Concurrency: the sender gives every transfer in flight a connection of its own (reused per
destination once idle), so concurrent transfers to one receiver never share a connection.
UCX environment defaults (UCX_TLS=tcp,self) are applied by shared.kv_transfer.ucx.env.
"""

from shared.kv_transfer.ucx.protocol import KVTransferError, KVTransferRejected
from shared.kv_transfer.ucx.receiver import KVReceiver
from shared.kv_transfer.ucx.sender import KVSender, parse_address
from shared.kv_transfer.ucx.stats import TransferCounters, TransferResult

__all__ = [
    "KVReceiver", "KVSender", "KVTransferError", "KVTransferRejected", "TransferCounters",
    "TransferResult", "parse_address",
]
