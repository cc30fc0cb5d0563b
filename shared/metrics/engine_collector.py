"""EngineCollector: the engine's gauges and counters, read at scrape time from the scheduler,
the block pool and EngineStats (no copies kept). Reads happen on the scraping thread without
locks: lengths and plain ints, each a consistent value, together at most a step apart.

Speculative decoding counters are exported when the engine has them (`engine.spec_stats`, a
SpecDecodeStats: num_drafts, num_draft_tokens, num_accepted_tokens, accepted_per_position);
they stay 0 while no draft is proposed.
"""

from collections.abc import Iterator, Mapping

from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from shared.engine.llm_engine import LLMEngine
from shared.metrics.families import FamilyMaker


def spec_decode_stats_of(engine: LLMEngine):
    """The engine's SpecDecodeStats, or None when it does no speculative decoding."""
    return getattr(engine, "spec_stats", None)


class EngineCollector(Collector):
    def __init__(self, engine: LLMEngine, labels: Mapping[str, str]):
        self.engine = engine
        self.labels = dict(labels)
        self.make = FamilyMaker(labels)

    def collect(self) -> Iterator:
        yield from self._gauges()
        yield from self._counters()
        yield from self._spec_decode()

    def _gauges(self) -> Iterator:
        scheduler, pool, make = self.engine.scheduler, self.engine.block_pool, self.make
        num_total, num_free = pool.num_blocks, pool.num_free_blocks
        yield make.gauge("vllm:num_requests_running", "Requests in the running batch.", len(scheduler.running))
        yield make.gauge("vllm:num_requests_waiting", "Requests waiting to be scheduled.", len(scheduler.waiting))
        yield make.gauge("vllm:kv_cache_usage_perc", "Fraction of KV cache blocks in use (0 to 1).",
                         (num_total - num_free) / num_total if num_total else 0.0)
        yield make.gauge("pdserve:num_requests_reserved", "Decode reservations waiting for their KV.",
                         len(scheduler.reserved))
        yield make.gauge("pdserve:num_requests_held", "Finished prefills whose blocks wait to be shipped.",
                         len(scheduler.held))
        yield make.gauge("pdserve:kv_cache_blocks", "KV cache blocks in the pool.", num_total)
        yield make.gauge("pdserve:kv_cache_free_blocks", "KV cache blocks free (cached ones included).", num_free)

    def _counters(self) -> Iterator:
        stats, make = self.engine.stats, self.make
        yield make.counter("vllm:prompt_tokens", "Prompt tokens of the requests this engine started "
                           "(prefix-cache hits and KV received from prefill included).", stats.num_prompt_tokens)
        yield make.counter("vllm:generation_tokens", "Tokens emitted by this engine (on a decode instance "
                           "this includes the first token, sampled by the prefill instance).",
                           stats.num_generation_tokens)
        yield make.counter("vllm:prefix_cache_queries", "Prompt tokens looked up in the prefix cache.",
                           stats.num_prefix_cache_queries)
        yield make.counter("vllm:prefix_cache_hits", "Prompt tokens found in the prefix cache.",
                           stats.num_prefix_cache_hits)
        yield make.counter("vllm:num_preemptions", "Requests preempted (to be recomputed).", stats.num_preemptions)
        yield make.counter("pdserve:prompt_tokens_computed", "Prompt tokens this engine computed "
                           "(recomputation after preemption included).", stats.num_prompt_tokens_computed)
        yield make.counter("pdserve:engine_steps", "Engine steps that ran a batch.", stats.num_steps)

    def _spec_decode(self) -> Iterator:
        spec = spec_decode_stats_of(self.engine)
        if spec is None:
            return
        make = self.make
        yield make.counter("vllm:spec_decode_num_drafts", "Draft proposals verified.", spec.num_drafts)
        yield make.counter("vllm:spec_decode_num_draft_tokens", "Draft tokens proposed.", spec.num_draft_tokens)
        yield make.counter("vllm:spec_decode_num_accepted_tokens", "Draft tokens accepted.", spec.num_accepted_tokens)
        family = CounterMetricFamily("vllm:spec_decode_num_accepted_tokens_per_pos",
                                     "Draft tokens accepted, by position in the draft.",
                                     labels=[*self.labels, "position"])
        for position, count in enumerate(list(spec.accepted_per_position)):
            family.add_metric([*self.labels.values(), str(position)], count)
        yield family
