"""EngineCollector: the engine's gauges and counters, read at scrape time from the engine
API's latest status (`EngineClient.latest_status`, no copies kept here).

Speculative decoding counters (num_drafts, num_draft_tokens, num_accepted_tokens,
accepted_per_position) are exported when the status has them; they stay 0 while no draft
is proposed.

`vllm:lora_requests_info` is GAIE's LoRA affinity signal (its model-server protocol): one
sample whose labels name the adapters of the running and of the waiting requests (comma
separated) and `max_lora`, the most adapters one step serves (0 without LoRA); its value is the
time of the scrape (seconds since the epoch), as vLLM's is the time of its last update, so a
reader picks the newest sample.
"""

import time

from collections.abc import Callable, Iterable, Iterator, Mapping

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from shared.engine_api.client import EngineStatus, KVTierStats
from shared.metrics.families import FamilyMaker
from shared.metrics.tier_metrics import tier_families


class EngineCollector(Collector):
    def __init__(self, read_status: Callable[[], EngineStatus], labels: Mapping[str, str],
                 read_more_tiers: Callable[[], Iterable[KVTierStats]] = tuple, max_loras: int = 0):
        """`read_more_tiers`: tiers the engine does not keep (a service's peer pulls);
        `max_loras`: the engine's --max-loras, 0 when it serves no adapters."""
        self.read_status = read_status
        self.max_loras = max_loras
        self.read_more_tiers = read_more_tiers
        self.labels = dict(labels)
        self.make = FamilyMaker(labels)

    def collect(self) -> Iterator:
        status = self.read_status()
        yield from self._gauges(status)
        yield self._lora_info(status)
        yield from self._counters(status)
        yield from self._spec_decode(status)
        yield from tier_families(self.make, [*status.kv_tiers, *self.read_more_tiers()])

    def _gauges(self, status: EngineStatus) -> Iterator:
        load, make = status.load, self.make
        num_total, num_free = load.num_total_blocks, load.num_free_blocks
        yield make.gauge("vllm:num_requests_running", "Requests in the running batch.", load.num_running)
        yield make.gauge("vllm:num_requests_waiting", "Requests waiting to be scheduled.", load.num_waiting)
        yield make.gauge("vllm:kv_cache_usage_perc", "Fraction of KV cache blocks in use (0 to 1).",
                         (num_total - num_free) / num_total if num_total else 0.0)
        yield make.gauge("pdserve:num_requests_reserved", "Decode reservations waiting for their KV.",
                         load.num_reserved)
        yield make.gauge("pdserve:num_requests_held", "Finished prefills whose blocks wait to be shipped.",
                         status.num_held)
        yield make.gauge("pdserve:kv_cache_blocks", "KV cache blocks in the pool.", num_total)
        yield make.gauge("pdserve:kv_cache_free_blocks", "KV cache blocks free (cached ones included).", num_free)

    def _lora_info(self, status: EngineStatus):
        labels = ("max_lora", "running_lora_adapters", "waiting_lora_adapters")
        row = (str(self.max_loras), ",".join(status.load.running_lora_adapters),
               ",".join(status.load.waiting_lora_adapters))
        return self.make.labelled(GaugeMetricFamily, "vllm:lora_requests_info", "LoRA adapters of the running and "
                                  "waiting requests; the value is when this was read (seconds since the epoch).",
                                  labels, [(row, time.time())])

    def _counters(self, stats: EngineStatus) -> Iterator:
        make = self.make
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
        yield make.counter("pdserve:kv_events_dropped", "KV-cache events (or batches of them) dropped before "
                           "they were published (--kv-events-endpoint; a full queue).", stats.num_kv_events_dropped)
        yield make.counter("pdserve:prompt_tokens_computed", "Prompt tokens this engine computed "
                           "(recomputation after preemption included).", stats.num_prompt_tokens_computed)
        yield make.counter("pdserve:engine_steps", "Engine steps that ran a batch.", stats.num_steps)

    def _spec_decode(self, status: EngineStatus) -> Iterator:
        spec = status.spec_decode
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
