"""GetStatus: the engine's counters and load, read on the engine thread for one consistent snapshot;
role handlers then add theirs (KV bytes moved, lease expiries)."""

from shared.engine.llm_engine import LLMEngine
from shared.pb.pdserve.v1 import instance_pb2 as pb


def engine_status(engine: LLMEngine) -> pb.InstanceStatus:
    """Run on the engine thread (AsyncEngine.call)."""
    scheduler, pool, stats = engine.scheduler, engine.block_pool, engine.stats
    return pb.InstanceStatus(
        num_waiting=len(scheduler.waiting), num_running=len(scheduler.running),
        num_reserved=len(scheduler.reserved), num_held=len(scheduler.held),
        num_free_blocks=pool.num_free_blocks, num_total_blocks=pool.num_blocks,
        num_prompt_tokens_computed=stats.num_prompt_tokens_computed,
        num_cached_prompt_tokens=stats.num_cached_prompt_tokens,
        num_generation_tokens=stats.num_generation_tokens,
        num_requests_finished=stats.num_requests_finished,
    )
