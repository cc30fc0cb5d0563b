"""Cluster state in Redis: instance registry with heartbeats, prefix index, block leases.

Gateways read this state to route each prompt to a prefill and a decode instance;
engine instances write it (registration, load, which KV blocks they hold).
"""
