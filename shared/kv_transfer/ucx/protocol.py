"""The KV wire protocol's version, in a module of its own so that whoever compares versions
(the registry, gateways) need not load the wire's torch code.

Bump it whenever what a prefill instance sends stops being readable by a decode instance of
the previous version: the header's fields or meaning, the chunking, the checksums. Instances
register it (shared.cluster.versions); gateways pair only instances that agree.
"""

# 3: the header names the LoRA adapter the KV was computed with (adapter_key), checked
#    against the reservation's. 2: payload in chunks with per-chunk CRC-32 trailers (1: one
#    message, one CRC).
FORMAT_VERSION = 3
