"""The public gateway: a stateless grpc.aio server that validates and tokenizes requests,
routes each to a prefill + decode pair (or a colocated instance) using the cluster state in
Redis, and relays the decode instance's token stream to the client.

Start it with `python -m services.gateway` or `pdserve serve gateway`.
"""


def main(argv=None) -> int:
    """`pdserve serve gateway [flags]` (the same as `python -m services.gateway [flags]`)."""
    from services.gateway.__main__ import main as run_gateway

    return run_gateway(argv)
