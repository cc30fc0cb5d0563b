"""Counters the engine keeps for benchmarks and metrics.

The engine thread writes them; the metrics collector (shared.metrics) reads them from other
threads at scrape time: plain ints, so a read sees some recent value, never a torn one.
"""

import time
from dataclasses import dataclass

from shared.core.scheduler import Scheduler
from shared.core.scheduler_output import SchedulerOutput
from shared.kv_cache.block_pool import BlockPool


@dataclass
class KVUsage:
    num_blocks_total: int
    block_size: int
    bytes_per_token: int
    peak_num_blocks_used: int
    # Tokens of running requests at the step with the most blocks in use.
    peak_num_tokens_held: int


@dataclass
class EngineStats:
    num_blocks_total: int
    block_size: int
    bytes_per_token: int
    num_steps: int = 0
    num_prompt_tokens_computed: int = 0
    num_generation_tokens: int = 0
    num_preemptions: int = 0
    num_requests_finished: int = 0
    # Prompt tokens served from the prefix cache, over finished requests.
    num_cached_prompt_tokens: int = 0
    peak_num_blocks_used: int = 0
    peak_num_tokens_held: int = 0
    # Counted once per request, when a step first schedules it (prompt chunk, or for the
    # decode role its first decode): all its prompt tokens, and those the prefix cache held.
    num_requests_scheduled: int = 0
    num_prompt_tokens: int = 0
    num_prefix_cache_queries: int = 0  # tokens looked up
    num_prefix_cache_hits: int = 0  # tokens found

    def record_schedule(self, output: SchedulerOutput, scheduler: Scheduler, pool: BlockPool) -> None:
        self.num_steps += not output.is_empty
        self._record_first_schedules(output, scheduler)
        self.num_prompt_tokens_computed += sum(item.num_tokens for item in output.scheduled
                                               if item.start_position < len(item.prompt_token_ids))
        self.num_preemptions += len(output.preempted_request_ids)
        num_used = pool.num_blocks - pool.num_free_blocks
        if num_used > self.peak_num_blocks_used:
            self.peak_num_blocks_used = num_used
            self.peak_num_tokens_held = sum(r.num_computed_tokens for r in scheduler.running) + output.num_batched_tokens

    def _record_first_schedules(self, output: SchedulerOutput, scheduler: Scheduler) -> None:
        now = time.monotonic()
        for item in output.scheduled:
            request = scheduler.requests.get(item.request_id)
            if request is None or request.first_scheduled_time is not None:
                continue
            request.first_scheduled_time = now
            self.num_requests_scheduled += 1
            self.num_prompt_tokens += request.num_prompt_tokens
            self.num_prefix_cache_queries += request.num_prompt_tokens
            self.num_prefix_cache_hits += request.num_cached_prompt_tokens

    def record_tokens(self, num_sampled: int) -> None:
        self.num_generation_tokens += num_sampled

    def record_finished(self, num_cached_prompt_tokens: int) -> None:
        self.num_requests_finished += 1
        self.num_cached_prompt_tokens += num_cached_prompt_tokens

    def kv_usage(self) -> KVUsage:
        return KVUsage(self.num_blocks_total, self.block_size, self.bytes_per_token,
                       self.peak_num_blocks_used, self.peak_num_tokens_held)
