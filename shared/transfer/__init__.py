"""Moving KV cache blocks from a prefill instance to a decode instance.

wire.py: the header, chunks.py: the payload's chunks (no network); ucx_transport.py:
KVSender / KVReceiver over UCX. Import the transport explicitly (`shared.transfer.ucx_transport`): it loads ucxx.
"""
