"""Observer: each interval, the gateways' metrics (rate, lengths, latencies), the prefill
instances' metrics (prefix-hit ratio) and the instances' heartbeats in Redis (queue depths,
running sequences, KV usage, live counts) become one Observation."""

import asyncio
import logging
import time
from collections.abc import Callable, Sequence

from shared.cluster.instances import InstanceLoad, InstanceRegistry

from services.planner.gateway_sample import GatewaySample, interval_between, scrape
from services.planner.observation import Observation
from services.planner.prefix_hits import PrefixCacheSample, PrefixHitTracker, scrape_prefix_cache

logger = logging.getLogger(__name__)


def pool_levels(loads_by_role: dict[str, list[InstanceLoad]]) -> dict[str, float | int]:
    """Observation fields from the live instances' last heartbeats."""
    prefill, decode = loads_by_role.get("prefill", []), loads_by_role.get("decode", [])
    total_blocks = sum(load.num_total_blocks for load in decode)
    used_blocks = sum(load.num_total_blocks - load.num_free_blocks for load in decode)
    return {"prefill_queue_depth": sum(load.queue_depth + load.num_running_requests for load in prefill),
            "decode_running": sum(load.num_running_requests for load in decode),
            "decode_queue_depth": sum(load.queue_depth for load in decode),
            "kv_usage": used_blocks / total_blocks if total_blocks else 0.0,
            "num_prefill": len(prefill), "num_decode": len(decode)}


class Observer:
    """`prefill_metrics_urls`: the prefill instances' /metrics URLs, a list or a function
    returning the current list (instances come and go)."""

    def __init__(self, registry: InstanceRegistry, gateway_metrics_urls: Sequence[str],
                 clock: Callable[[], float] = time.monotonic, fetch: Callable[[str], GatewaySample] = scrape,
                 prefill_metrics_urls: Sequence[str] | Callable[[], Sequence[str]] = (),
                 fetch_prefix_cache: Callable[[str], PrefixCacheSample] = scrape_prefix_cache):
        self.registry = registry
        self.urls = list(gateway_metrics_urls)
        self.clock = clock
        self.fetch = fetch
        self.prefill_urls = prefill_metrics_urls if callable(prefill_metrics_urls) else (lambda: prefill_metrics_urls)
        self.prefix_hits = PrefixHitTracker(fetch_prefix_cache)
        self._last: tuple[float, GatewaySample] | None = None

    def _gateways(self) -> GatewaySample:
        total = GatewaySample()
        for url in self.urls:
            try:
                total = total.add(self.fetch(url))
            except OSError as error:
                logger.warning("planner: cannot scrape %s: %r", url, error)
        return total

    async def observe(self) -> Observation:
        sample = await asyncio.to_thread(self._gateways)
        hit_ratio = await asyncio.to_thread(self.prefix_hits.observe, list(self.prefill_urls()))
        now = self.clock()
        before = self._last or (now, sample)
        self._last = (now, sample)
        interval = interval_between(before[1], sample, now - before[0])
        loads: dict[str, list[InstanceLoad]] = {}
        for info, load in await self.registry.list_live():
            loads.setdefault(info.role, []).append(load)
        return Observation(request_rate=interval.request_rate, mean_prompt_tokens=interval.mean_prompt_tokens,
                           mean_output_tokens=interval.mean_output_tokens, ttft_p90_s=interval.ttft_p90_s,
                           itl_p90_s=interval.itl_p90_s, prefix_hit_ratio=hit_ratio, **pool_levels(loads))
