"""The KV transfer protocol's version and the errors its two sides raise, in a module of its
own (no imports) so that whoever compares versions (the registry, gateways) need not load the
transport's torch or ucxx code.

Bump FORMAT_VERSION whenever what a prefill instance sends stops being readable by a decode
instance of the previous version: the header's fields or meaning, the chunking, the checksums.
Instances register it (shared.cluster.versions); gateways pair only instances that agree.

KVTransferError is raised by the header checks (header.py), the frame reader (framing.py), the
receiver (rejections, timeouts) and the sender (the receiver's rejection, re-raised on the
sending side). Bad arguments from our own caller (wrong block ids, wrong tensor) are
`shared.errors.InvalidRequestError` instead.
"""

# 3: the header names the LoRA adapter the KV was computed with (adapter_key), checked
#    against the reservation's. 2: payload in chunks with per-chunk CRC-32 trailers (1: one
#    message, one CRC).
FORMAT_VERSION = 3


class KVTransferError(RuntimeError):
    """A transfer failed. `field` names the header field or stage at fault, e.g. "head_dim"."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class KVTransferRejected(KVTransferError):
    """The receiver refused the header or the payload and said why; nothing was written there."""
