"""The prefix-hit ratio the prefill pool sees: each prefill instance's /metrics counts prompt
tokens looked up in its prefix cache (`vllm:prefix_cache_queries_total`) and found there
(`vllm:prefix_cache_hits_total`); between two scrapes, hits / queries summed over the
instances is the share of prompt tokens the pool did not have to compute."""

import logging
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

logger = logging.getLogger(__name__)

QUERIES = "vllm:prefix_cache_queries_total"
HITS = "vllm:prefix_cache_hits_total"


@dataclass(frozen=True)
class PrefixCacheSample:
    queries: float = 0.0  # prompt tokens looked up, since the instance started
    hits: float = 0.0  # of which found cached


def parse_prefix_cache(text: str) -> PrefixCacheSample:
    totals = {QUERIES: 0.0, HITS: 0.0}
    for family in text_string_to_metric_families(text):
        for metric in family.samples:
            if metric.name in totals:
                totals[metric.name] += metric.value
    return PrefixCacheSample(totals[QUERIES], totals[HITS])


def scrape_prefix_cache(url: str, timeout_s: float = 2.0) -> PrefixCacheSample:
    with urllib.request.urlopen(url, timeout=timeout_s) as response:  # noqa: S310 - operator-given URL
        return parse_prefix_cache(response.read().decode("utf-8"))


class PrefixHitTracker:
    """Hit ratio over each interval, from cumulative counters per instance URL. An instance
    seen for the first time, or whose counters went back (a restart), adds nothing that interval."""

    def __init__(self, fetch: Callable[[str], PrefixCacheSample] = scrape_prefix_cache):
        self.fetch = fetch
        self._last: dict[str, PrefixCacheSample] = {}

    def observe(self, urls: Iterable[str]) -> float | None:
        """hits / queries since the last call, or None when no prompt was looked up."""
        queries = hits = 0.0
        current: dict[str, PrefixCacheSample] = {}
        for url in urls:
            try:
                sample = current[url] = self.fetch(url)
            except OSError as error:
                logger.warning("planner: cannot scrape %s: %r", url, error)
                continue
            before = self._last.get(url)
            if before is None or sample.queries < before.queries or sample.hits < before.hits:
                continue
            queries += sample.queries - before.queries
            hits += sample.hits - before.hits
        self._last = current
        return min(1.0, hits / queries) if queries > 0 else None
