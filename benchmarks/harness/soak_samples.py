"""The soak benchmark's memory samples: every process's RSS (from /proc) and, for processes
with a /metrics address, their `pdserve:memory_bytes{component}` gauges, every `interval_s`."""

import asyncio
import re
import time
from dataclasses import dataclass, field

import httpx2

from shared.memory.process import resident_bytes

_COMPONENT_LINE = re.compile(r'^pdserve:memory_bytes\{[^}]*component="(\w+)"[^}]*\}\s+(\S+)$', re.MULTILINE)


@dataclass
class MemorySample:
    elapsed_s: float
    rss_bytes: dict[str, int]  # process name -> VmRSS
    components: dict[str, dict[str, int]] = field(default_factory=dict)  # process -> component -> bytes


def parse_components(metrics_text: str) -> dict[str, int]:
    return {name: int(float(value)) for name, value in _COMPONENT_LINE.findall(metrics_text)}


class MemorySampler:
    def __init__(self, pids: dict[str, int], metrics_urls: dict[str, str], interval_s: float):
        self.pids, self.metrics_urls, self.interval_s = pids, metrics_urls, interval_s
        self.samples: list[MemorySample] = []
        self.started = time.perf_counter()

    async def run(self, duration_s: float) -> None:
        async with httpx2.AsyncClient(timeout=10.0) as http:
            while (elapsed := time.perf_counter() - self.started) <= duration_s:
                sample = MemorySample(elapsed, {name: resident_bytes(pid) for name, pid in self.pids.items()})
                for name, url in self.metrics_urls.items():
                    sample.components[name] = await self._components(http, url)
                self.samples.append(sample)
                await asyncio.sleep(self.interval_s)

    @staticmethod
    async def _components(http, url: str) -> dict[str, int]:
        try:
            response = await http.get(url)
            return parse_components(response.text)
        except Exception:  # noqa: BLE001 - a missed scrape is a gap in the plot, nothing more
            return {}
