"""`pdserve status`: the instances registered in Redis (serving or draining), their load,
and block leases.

Reads the cluster state of one deployment and model (the same namespace the services use)
and prints a table; `--json` prints the same as JSON.
"""

import argparse
import json
import os
import sys
from pathlib import Path

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Called by services.cli.main.build_parser to register this subcommand."""
    parser = subparsers.add_parser("status", help="list registered instances, their load and leases")
    parser.add_argument("--redis-url", default=os.environ.get("PDSERVE_REDIS_URL", DEFAULT_REDIS_URL),
                        help=f"Redis (default: $PDSERVE_REDIS_URL or {DEFAULT_REDIS_URL})")
    parser.add_argument("--deployment", default=os.environ.get("PDSERVE_DEPLOYMENT", "default"),
                        help="deployment (default: $PDSERVE_DEPLOYMENT or default)")
    parser.add_argument("--model", default=os.environ.get("PDSERVE_SERVED_MODEL_NAME")
                        or os.environ.get("PDSERVE_MODEL"),
                        help="served model name, folder or .gguf (default: the bundled model)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.set_defaults(run=run)


def namespace_model_name(model: str | None) -> str:
    """The name the services register under: a folder's (or converted GGUF's) folder name."""
    from shared.model.default_model import DEFAULT_MODEL_NAME, cache_entry_name, default_gguf_path

    if model is None or model == DEFAULT_MODEL_NAME:
        return cache_entry_name(default_gguf_path())
    path = Path(model).expanduser()
    if path.is_dir():
        return path.name
    if path.is_file() and path.suffix == ".gguf":
        return cache_entry_name(path)
    return model


def run(args: argparse.Namespace) -> int:
    import asyncio

    from shared.cluster.keys import ClusterNamespace

    namespace = ClusterNamespace(args.deployment, namespace_model_name(args.model))
    try:
        instances, leases, board, tiers = asyncio.run(_read(args.redis_url, namespace))
    except OSError as error:  # redis ConnectionError/TimeoutError derive from OSError here
        print(f"pdserve status: error: cannot read {args.redis_url}: {error}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps({**_as_json(namespace, instances, leases), "supervised": board,
                          "kv_tiers": _tiers_as_json(tiers)}, indent=2))
    else:
        print_table(namespace, instances, leases)
        print_tiers(tiers)
        print_board(board)
    return 0


async def _read(redis_url: str, namespace):
    import redis.asyncio

    from shared.cluster.instances import InstanceRegistry
    from shared.cluster.keys import supervisor_key
    from shared.cluster.lease_mirror import list_mirrored_leases
    from shared.cluster.tier_board import TierBoard
    from services.launcher.supervision_board import parse_board

    client = redis.asyncio.Redis.from_url(redis_url, socket_timeout=3.0, socket_connect_timeout=3.0)
    try:
        instances = await InstanceRegistry(client, namespace).list_live(include_draining=True)
        leases = await list_mirrored_leases(client, namespace)
        board = parse_board(await client.hgetall(supervisor_key(namespace.deployment)))
        tiers = await TierBoard(client, namespace, ttl_s=1.0).read(info.instance_id for info, _ in instances)
    except redis.exceptions.RedisError as error:
        raise OSError(str(error)) from error
    finally:
        await client.aclose()
    return instances, leases, board, tiers


def _as_json(namespace, instances, leases) -> dict:
    from dataclasses import asdict

    return {
        "deployment": namespace.deployment, "model": namespace.model,
        "instances": [{**asdict(info), **asdict(load)} for info, load in instances],
        "leases": [asdict(lease) for lease in leases],
    }


def print_table(namespace, instances, leases) -> None:
    num_draining = sum(info.is_draining for info, _ in instances)
    print(f"deployment {namespace.deployment}, model {namespace.model}: {len(instances)} live instances"
          + (f" ({num_draining} draining)" if num_draining else ""))
    header = ("INSTANCE", "ROLE", "STATE", "GRPC", "UCX", "QUEUE", "RUNNING", "FREE/TOTAL BLOCKS", "CACHE",
              "VERSION", "KV EVENTS")
    rows = [(info.instance_id, info.role, info.state, info.grpc_address, info.ucx_address or "-",
             str(load.queue_depth), str(load.num_running_requests),
             f"{load.num_free_blocks}/{load.num_total_blocks}", _cache_summary(info.cache), _version_summary(info),
             info.kv_events_endpoint or "-")
            for info, load in instances]
    _print_rows(header, rows)
    print(f"\n{len(leases)} block leases")
    if leases:
        _print_rows(("INSTANCE", "REQUEST", "BLOCKS", "EXPIRES IN"),
                    [(lease.instance_id, lease.request_id, str(len(lease.block_ids)),
                      f"{lease.remaining_s:.1f}s") for lease in leases])


def _tiers_as_json(tiers) -> dict:
    from dataclasses import asdict

    return {instance_id: [{**asdict(tier), "num_bytes": tier.num_bytes} for tier in found]
            for instance_id, found in tiers.items()}


def print_tiers(tiers) -> None:
    """Per instance and KV tier (host, file, peer): blocks held (the whole host's for a host
    tier), this instance's hits, misses, loads, load time, tokens not recomputed, decisions."""
    rows = [(instance_id, tier.tier, f"{tier.num_blocks}/{tier.capacity_blocks}" if tier.capacity_blocks else "-",
             f"{tier.num_bytes / 2**30:.2f}", str(tier.num_hits), str(tier.num_misses), str(tier.num_loads),
             str(tier.num_stores), str(tier.num_evictions), str(tier.num_corrupt),
             f"{tier.load_seconds * 1e3 / tier.num_loads:.2f}" if tier.num_loads else "-",
             str(tier.recompute_avoided_tokens), f"{tier.num_load_decisions}/{tier.num_recompute_decisions}")
            for instance_id, found in tiers.items() for tier in found]
    if not rows:
        return
    print("\nKV tiers")
    _print_rows(("INSTANCE", "TIER", "BLOCKS", "GIB", "HITS", "MISSES", "LOADS", "STORES", "EVICTED", "CORRUPT",
                 "MS/BLOCK", "TOKENS AVOIDED", "LOAD/RECOMPUTE"), rows)


def _cache_summary(cache) -> str:
    """e.g. "16/sha256/bfloat16/tp1" (block size, hash, dtype, TP size); "-" when not registered."""
    if cache is None:
        return "-"
    return f"{cache.block_size}/{cache.prefix_hash_algo}/{cache.dtype}/tp{cache.tensor_parallel_size}"


def _version_summary(info) -> str:
    """e.g. "0.1.0/kv3" (pdserve version, KV wire protocol version; "kv?" when not registered)."""
    protocol = f"kv{info.kv_protocol_version}" if info.kv_protocol_version else "kv?"
    return f"{info.pdserve_version or '?'}/{protocol}"


def print_board(board: dict[str, dict]) -> None:
    """The children `pdserve up` supervises, with their restart counts (nothing without one)."""
    if not board:
        return
    print(f"\n{len(board)} children supervised by pdserve up")
    _print_rows(("CHILD", "ROLE", "STATE", "RESTARTS", "LAST EXIT"),
                [(name, entry.get("role", "?"), entry.get("state", "?"), str(entry.get("restarts", 0)),
                  str(entry.get("last_exit_code", "-"))) for name, entry in board.items()])


def _print_rows(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> None:
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())
