"""`pdserve bench serve`: an async load generator for pdserve's gateway and OpenAI-compatible
servers, in the spirit of `vllm bench serve`. It sits below the CLI, which runs it, and above
the other services, which never import it; the repository's benchmarks (benchmarks/) use it too.

Pieces, each in its own module: `datasets` (random, shared-prefix and JSONL prompts),
`arrivals` (Poisson/gamma arrival schedule), `clients/` (pdserve gRPC and OpenAI SSE
streaming clients that time every streamed message), `runner` (sends one workload at one
rate), `metrics` (TTFT, TPOT, ITL, e2e latency, throughput, goodput), `report` (text table
and result JSON), `plots` (PNG figures), `sweep` (one run per request rate).
"""
