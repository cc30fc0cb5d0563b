"""KV block transfer over UCX (ucxx): the public entry point for prefill and decode services.

    from shared.transfer.ucx_transport import KVReceiver, KVSender

Protocol, per connection and one transfer at a time (messages in proto/pdserve/v1/kv_transfer.proto):
  1. sender -> receiver: KVTransferHeader (length-prefixed frame, shared.transfer.framing)
  2. receiver -> sender: KVTransferAck ACCEPTED, or REJECTED with the field at fault
  3. sender -> receiver: the payload, one ucxx message of header.payload_bytes raw bytes
  4. receiver -> sender: KVTransferAck COMPLETED once verified and written, or REJECTED
No payload byte crosses the wire before the receiver accepted the header, so rejected
transfers (unknown request id, layout mismatch) cost one small round trip and write nothing.

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
