"""One tensor/pipeline-parallel rank: a child process (worker_main.py) that loads its shard
and runs steps.

It joins torch.distributed through the engine's TCP store (gloo on CPU), loads its weights
shard, allocates its KV cache shard (its layers, its KV heads, the engine's block count: block
tables are the same on every rank), then for each message on the step ring rebuilds the
SchedulerOutput and runs it. The output rank answers on the reply ring. Any error ends the
process with a non-zero code, which the engine notices; a worker whose engine disappeared exits.
"""

import logging
import os
import sys
from datetime import timedelta
from typing import NoReturn

import torch
import torch.distributed as dist

from shared.executor.kv_shards import map_shard, shard_of_rank
from shared.executor.shm_ring import RingClosedError, ShmRing
from shared.executor.stage_runner import StageRunner
from shared.executor.step_message import WorkerRequests, decode_step
from shared.executor.worker_lora import WorkerAdapters
from shared.executor.worker_reply import WorkerReply, encode_reply
from shared.executor.worker_startup import WorkerStartup
from shared.kv_cache.layout import KVCacheLayout
from shared.logging_setup import configure_child_logging
from shared.model.config import ModelConfig
from shared.parallel.groups import ParallelGroups, create_groups
from shared.parallel.shard_loader import load_model_shard

logger = logging.getLogger(__name__)


def run_worker(args: WorkerStartup) -> NoReturn:
    """Serve steps until shutdown, then end the process: status 0 after a shutdown or with the
    engine gone, 1 after a failure (logged). It skips the interpreter's teardown (seconds of
    freeing torch's state on a busy machine): the OS reclaims the mappings and sockets."""
    configure_child_logging(f"rank{args.rank}")
    status = 0
    try:
        _serve(args)
    except RingClosedError:
        pass
    except BaseException:  # noqa: BLE001 - the engine sees the exit code
        logger.exception("worker rank %d failed", args.rank)
        status = 1
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def _join(args: WorkerStartup) -> ParallelGroups:
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    store = dist.TCPStore("127.0.0.1", args.store_port, is_master=False, timeout=timedelta(minutes=5))
    dist.init_process_group("gloo", store=store, rank=args.rank, world_size=args.world_size)
    return create_groups(args.rank, args.tensor_parallel_size, args.pipeline_parallel_size)


def _serve(args: WorkerStartup) -> None:
    torch.set_num_threads(args.num_threads)
    torch.manual_seed(args.seed)
    check = _engine_alive_check(args.engine_pid)
    check()
    full_layout = args.kv_layout.to_layout()
    shard = shard_of_rank(args.kv_folder, full_layout, args.tensor_parallel_size, args.pipeline_parallel_size,
                          args.rank)
    groups = _join(args)
    adapters = None
    if args.lora is not None:
        adapters = WorkerAdapters(args.lora.to_config(), ModelConfig.from_folder(args.model_folder), groups,
                                  full_layout.dtype)
    model, config = load_model_shard(args.model_folder, full_layout.dtype, groups, fuse_mlp=adapters is None,
                                     before_parallel=adapters.attach if adapters is not None else None)
    layout = KVCacheLayout(config.num_layers, full_layout.num_blocks, full_layout.block_size, config.num_kv_heads,
                           config.head_dim, full_layout.dtype)
    if layout != shard.layout:
        raise RuntimeError(f"rank {args.rank}: the model shard needs KV layout {layout}, "
                           f"the engine made {shard.layout}")
    runner = StageRunner(model, layout, groups, map_shard(shard), adapters.slots if adapters is not None else None)
    steps = ShmRing.attach(*args.step_ring)
    replies = ShmRing.attach(*args.reply_ring) if groups.is_output_rank else None
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
            resident = adapters.slots.resident_ids() if adapters is not None else []
            replies.write(encode_reply(WorkerReply(output=output, comm_seconds=groups.comm_seconds,
                                                   resident_lora_ids=resident)), check)
    dist.destroy_process_group()


def _engine_alive_check(engine_pid: int):
    def check() -> None:
        if os.getppid() != engine_pid:
            raise RingClosedError("the engine process is gone")
    return check
