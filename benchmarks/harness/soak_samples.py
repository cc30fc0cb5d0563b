"""The soak benchmark's memory samples: the RSS (from /proc) of every watched service's process
tree, each process on its own (an engine-core child included), and, for services with a
/metrics address, their `pdserve:memory_bytes{component}` gauges, every `interval_s`."""

import asyncio
import re
import time
from dataclasses import dataclass, field

import httpx2

from benchmarks.harness.process_tree import parent_pids, tree_resident_bytes

_COMPONENT_LINE = re.compile(r'^pdserve:memory_bytes\{[^}]*component="(\w+)"[^}]*\}\s+(\S+)$', re.MULTILINE)
_ARENAS_LINE = re.compile(r'^pdserve:malloc_arenas(?:\{[^}]*\})?\s+(\S+)$', re.MULTILINE)


@dataclass
class MemorySample:
    elapsed_s: float
    rss_bytes: dict[str, int]  # process name ("prefill-0", "prefill-0/engine_core", ...) -> VmRSS
    # process -> component -> bytes (and "malloc_arenas": glibc's arena count)
    components: dict[str, dict[str, int]] = field(default_factory=dict)


def parse_components(metrics_text: str) -> dict[str, int]:
    """`pdserve:memory_bytes{component}` by component, plus "malloc_arenas" (a count) if exported."""
    components = {name: int(float(value)) for name, value in _COMPONENT_LINE.findall(metrics_text)}
    arenas = _ARENAS_LINE.search(metrics_text)
    if arenas:
        components["malloc_arenas"] = int(float(arenas.group(1)))
    return components


class MemorySampler:
    def __init__(self, pids: dict[str, int], metrics_urls: dict[str, str], interval_s: float):
        self.pids, self.metrics_urls, self.interval_s = pids, metrics_urls, interval_s
        self.samples: list[MemorySample] = []
        self.started = time.perf_counter()

    async def run(self, duration_s: float) -> None:
        async with httpx2.AsyncClient(timeout=10.0) as http:
            while (elapsed := time.perf_counter() - self.started) <= duration_s:
                sample = MemorySample(elapsed, self.read_rss())
                for name, url in self.metrics_urls.items():
                    sample.components[name] = await self._components(http, url)
                self.samples.append(sample)
                await asyncio.sleep(self.interval_s)

    def read_rss(self) -> dict[str, int]:
        parents = parent_pids()
        rss = {}
        for name, pid in self.pids.items():
            rss.update(tree_resident_bytes(name, pid, parents))
        return rss

    @staticmethod
    async def _components(http, url: str) -> dict[str, int]:
        try:
            response = await http.get(url)
            return parse_components(response.text)
        except Exception:  # noqa: BLE001 - a missed scrape is a gap in the plot, nothing more
            return {}
