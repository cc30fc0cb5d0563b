"""pdserve services: the gateway and the engine instances (prefill, decode, colocated).

Engine instances share `services.instance` (their runtime: loading, serving, Redis presence,
shutdown); `services.prefill` and `services.decode` hold the role-specific RPC handlers. What
every service shares is split by job: `services.rpc` (gRPC), `services.tls`, `services.settings`,
`services.observability` (metrics, tracing) and `services.cost_model` (`pdserve profile`'s data).
"""
