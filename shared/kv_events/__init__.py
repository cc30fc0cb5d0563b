"""KV-cache events in vLLM's wire format: what an engine stores into and removes from its
prefix cache (and its KV tiers), published on a ZeroMQ PUB socket for indexers outside pdserve
(llm-d's KV-cache indexer behind a GAIE endpoint picker; docs/kubernetes.md).

`wire` holds the message types, `log` records events as the engine makes them, `publisher`
sends them from a thread of its own, `stream` ties the two to one engine.
"""
