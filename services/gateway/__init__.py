"""The public gateway: a stateless grpc.aio server that validates and tokenizes requests,
routes each to a prefill + decode pair (or a colocated instance) using the cluster state in
Redis, and relays the decode instance's token stream to the client.

Start it with `python -m services.gateway` or `pdserve serve gateway`.
"""
