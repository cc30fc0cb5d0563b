"""pdserve services: the gateway and the engine instances (prefill, decode, colocated).

Engine instances share `services.common` (settings, gRPC server, Redis presence, shutdown);
`services.prefill` and `services.decode` hold the role-specific RPC handlers.
"""
