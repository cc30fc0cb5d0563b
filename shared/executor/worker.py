"""One tensor/pipeline-parallel rank: a spawned process that loads its shard and runs steps.

It joins torch.distributed through the engine's TCP store (gloo on CPU), loads its weights
shard, allocates its KV cache shard (its layers, its KV heads, the engine's block count: block
tables are the same on every rank), then for each message on the step ring rebuilds the
SchedulerOutput and runs it. The output rank answers on the reply ring. Any error ends the
process with a non-zero code, which the engine notices; a worker whose engine disappeared exits.
"""

import logging
import os
import sys
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from shared.executor.kv_shards import KVShard, map_shard
from shared.executor.shm_ring import RingClosedError, ShmRing
from shared.executor.stage_runner import StageRunner
from shared.executor.step_message import WorkerRequests, decode_step
from shared.executor.worker_reply import WorkerReply, encode_reply
from shared.kv_cache.layout import KVCacheLayout
from shared.parallel.groups import ParallelGroups, create_groups
from shared.parallel.shard_loader import load_model_shard

logger = logging.getLogger(__name__)

RingSpec = tuple[str, int, int, int]


@dataclass(frozen=True)
class WorkerArgs:
    rank: int
    tensor_parallel_size: int
    pipeline_parallel_size: int
    store_port: int
    model_folder: str
    dtype: torch.dtype
    num_blocks: int
    block_size: int
    num_threads: int
    seed: int
    step_ring: RingSpec
    reply_ring: RingSpec
    kv_shard: KVShard


def run_worker(args: WorkerArgs) -> None:
    """Process entry point."""
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format=f"%(asctime)s rank{args.rank} %(levelname)s %(name)s: %(message)s")
    try:
        _serve(args)
    except RingClosedError:
        os._exit(0)
    except BaseException:  # noqa: BLE001 - the engine sees the exit code
        logger.exception("worker rank %d failed", args.rank)
        sys.stderr.flush()
        os._exit(1)


def _join(args: WorkerArgs) -> ParallelGroups:
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    store = dist.TCPStore("127.0.0.1", args.store_port, is_master=False, timeout=timedelta(minutes=5))
    world_size = args.tensor_parallel_size * args.pipeline_parallel_size
    dist.init_process_group("gloo", store=store, rank=args.rank, world_size=world_size)
    return create_groups(args.rank, args.tensor_parallel_size, args.pipeline_parallel_size)


def _serve(args: WorkerArgs) -> None:
    torch.set_num_threads(args.num_threads)
    torch.manual_seed(args.seed)
    groups = _join(args)
    model, config = load_model_shard(args.model_folder, args.dtype, groups)
    layout = KVCacheLayout(config.num_layers, args.num_blocks, args.block_size, config.num_kv_heads,
                           config.head_dim, args.dtype)
    if layout != args.kv_shard.layout:
        raise RuntimeError(f"rank {args.rank}: the model shard needs KV layout {layout}, "
                           f"the engine made {args.kv_shard.layout}")
    runner = StageRunner(model, layout, groups, map_shard(args.kv_shard))
    steps = ShmRing.attach(*args.step_ring)
    replies = ShmRing.attach(*args.reply_ring) if groups.is_output_rank else None
    check = _engine_alive_check(os.getppid())
    dist.barrier()
    if replies is not None:
        replies.write(encode_reply(WorkerReply(ready=True)), check)
    requests = WorkerRequests()
    while True:
        message = decode_step(steps.read(args.rank, check))
        if message.shutdown:
            break
        groups.comm_seconds = 0.0
        output = runner.execute(requests.apply(message))
        if replies is not None:
            replies.write(encode_reply(WorkerReply(output=output, comm_seconds=groups.comm_seconds)), check)
    dist.destroy_process_group()


def _engine_alive_check(engine_pid: int):
    def check() -> None:
        if os.getppid() != engine_pid:
            raise RingClosedError("the engine process is gone")
    return check
