"""The engine's typed API: what a service may know of an engine (issue 29).

`client.py` holds the `EngineClient` protocol and the plain data it takes and gives
(`GenerateRequest`, `KVReservation`, `CachedSend`, `EngineInfo`, `EngineStatus`, ...);
`outputs.py` the per-request outputs (`RequestOutput`, `CompletionOutput`, `SampledLogprobs`);
`errors.py` what a client raises besides InvalidRequestError (shared.errors).

The package sits below the engine implementation (shared.engine, shared.core, shared.executor,
shared.kv_cache's pool, shared.kv_transfer.ucx): the implementation imports it, it imports none
of them (import-linter contract "engine-api-below-implementation"), and services reach an engine
only through it ("services-use-the-engine-api"), the composition root that builds engines
excepted.
"""
