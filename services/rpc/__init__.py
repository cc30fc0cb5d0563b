"""gRPC as every pdserve server and channel speaks it: the server set-up (health, reflection,
keepalive, no port sharing), message size limits, requests that must arrive whole, handler
wrapping, tracing interceptors, how a failure becomes a status with bounded text, and the
health probe with the ready file it reads.
"""
