"""The KV connector: how an engine exchanges KV blocks with other engines (disaggregation).

`base.KVConnector` is the interface (scheduler side and worker side, roles producer / consumer
/ both); `types` holds the plain data it exchanges; `factory` builds the connector named in
the engine config (by module path, so this engine layer never imports a transport);
`in_memory` is a reference implementation that copies blocks between engines of one process;
`address` parses a consumer's "host:port". All of these sit in the engine tier and import no
transport. The UCX implementation, the subpackage `ucx` (its connector:
"shared.kv_transfer.ucx.connector:UCXConnector"), sits in the disaggregation tier: it imports
this API, nothing of the engine tier imports it (import-linter contracts in pyproject.toml).
"""
