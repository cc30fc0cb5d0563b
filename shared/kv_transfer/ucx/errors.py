"""The error a KV transfer raises when the peer, the wire or the clock is at fault.

Raised by shared.kv_transfer.ucx.header (header checks), the receiver (rejections, timeouts)
and the sender (the receiver's rejection, re-raised on the sending side). Bad arguments from
our own caller (wrong block ids, wrong tensor) are `shared.errors.InvalidRequestError` instead.
"""


class KVTransferError(RuntimeError):
    """A transfer failed. `field` names the header field or stage at fault, e.g. "head_dim"."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class KVTransferRejected(KVTransferError):
    """The receiver refused the header or the payload and said why; nothing was written there."""
