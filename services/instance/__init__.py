"""One engine instance's process, whatever its role: its settings and flags, the entry point,
the runtime (load, serve, drain, restart a crashed engine core), the Instance gRPC servicer,
Redis registration with heartbeats and the prefix-index publisher, GetStatus, LoRA adapters,
and the composition root that builds its engine (engine_setup). Role handlers
(services.prefill, services.decode) plug into `InstanceRuntime`.
"""
