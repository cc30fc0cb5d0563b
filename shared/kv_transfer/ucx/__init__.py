"""The UCX implementation of the KV connector: moving KV cache blocks from a prefill instance to
a decode instance over UCX (ucxx). It sits in the disaggregation tier, above the connector API
of its parent package, which loads it by module path only (shared.kv_transfer.factory).

connector.py: UCXConnector, the KVConnector. transport.py: KVSender / KVReceiver
(sender.py, receiver.py), the protocol at a glance. header.py: the transfer's header, built and
checked; chunks.py: the payload's chunks; framing.py: one protobuf message per ucxx message;
protocol.py: the format's version and the transfer errors (no imports). env.py and lifecycle.py:
the process-wide ucxx import and teardown. Import modules explicitly: this package imports
nothing, so reading the version does not load ucxx.
"""
