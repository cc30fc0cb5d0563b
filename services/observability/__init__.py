"""Metrics and tracing of the services: the `/metrics` listener, an engine instance's
Prometheus metrics (engine, role counters, memory), and the tracing settings and start-up
every service shares. (The gRPC tracing interceptors are in services.rpc.)
"""
