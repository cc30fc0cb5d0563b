"""KV tiers below an engine's block pool: a host tier in shared memory and a file tier on local
disk (shared.kv_tier.manager), with the measured load-or-recompute choice (cost.py)."""
