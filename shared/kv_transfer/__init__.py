"""The KV connector: how an engine exchanges KV blocks with other engines (disaggregation).

`base.KVConnector` is the interface (scheduler side and worker side, roles producer / consumer
/ both); `types` holds the plain data it exchanges; `factory` builds the connector named in
the engine config (by module path, so this engine layer never imports a transport);
`in_memory` is a reference implementation that copies blocks between engines of one process.
The UCX implementation lives in the disaggregation layer (shared.transfer.ucx_connector).
"""
