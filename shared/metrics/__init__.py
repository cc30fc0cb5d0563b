"""Prometheus metrics of an engine: a collector that reads the engine's own counters at scrape
time (`EngineCollector`), real histograms of request latencies observed by the engine client
(`RequestLatencyTracker`, an engine client's OutputObserver). The `/metrics` HTTP listener is
services.common.metrics_server.

Names follow vLLM's (`vllm:*`) where the meaning is the same; pdserve's own are `pdserve:*`.
Every series carries the labels the service gives (model_name, role, instance_id).
"""
