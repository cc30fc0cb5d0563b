"""The gateway's OpenAI-compatible HTTP API (FastAPI on uvicorn, in the gateway process).

A second front door onto the same generation path as the gRPC API: OpenAI requests become
the gateway's GenerateRequest messages (`to_internal`), go through `generate_stream`
(validation, tokenization, routing, failover, fan-out), and the relayed messages are shaped
into OpenAI responses (`builder`, SSE in `sse`). `app.build_app` makes the app,
`server.HttpFrontDoor` serves it beside the gRPC server.
"""
