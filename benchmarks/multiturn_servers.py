"""The servers `make bench-multiturn` compares, each behind an OpenAI API, with what it says
about its caches:

  pdserve-tiers     the `make run` stack (1 prefill + 1 decode) with its defaults: the host KV
                    tier (a fresh arena in /dev/shm for this run, sized by --host-tier-gb) and
                    peer reuse on
  pdserve-no-tiers  the same stack with the host tier and peer reuse off (pool prefix caches only)
  vllm              `vllm serve` with prefix caching, its KV cache as many tokens as one pdserve
                    pool (--num-gpu-blocks-override, in its CPU backend's 128-token blocks)

Both pdserve stacks get pools of --pool-gb each, sized so that the conversations outgrow them.
`cache_counters()` reads the servers' /metrics: pdserve's prefill instances (prompt tokens, the
pool's hits and each tier's loads), vLLM's prefix-cache queries and hits.
"""

import contextlib
import dataclasses
import shutil
import tempfile
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from benchmarks.serve_servers import (ServerOptions, ServerStartError, pdserve_stack_config, vllm_server,
                                      wait_until_http_ready)

SERVERS = ("pdserve-tiers", "pdserve-no-tiers", "vllm")
TIERS = ("host", "file", "peer")


@dataclass
class RunningServer:
    name: str
    base_url: str
    metrics_addresses: list[str]  # pdserve: the prefill instances'; vllm: the server's own


@dataclass(frozen=True)
class MultiturnServerOptions:
    base: ServerOptions
    pool_gb: float
    host_tier_gb: float          # -1: sized to the machine
    file_tier_gb: float = 0.0
    bytes_per_token: int = 2 * 30 * 3 * 64 * 2  # SmolLM2 in bf16: K and V, 30 layers, 3 KV heads of 64

    @property
    def pool_tokens(self) -> int:
        return int(self.pool_gb * 2**30) // self.bytes_per_token


VLLM_CPU_BLOCK_SIZE = 128
MAX_MODEL_LEN = 8192  # SmolLM2's


@contextlib.contextmanager
def open_server(name: str, options: MultiturnServerOptions, run_dir: Path) -> Iterator[RunningServer]:
    if name == "vllm":
        kv_gib = max(1, -(-int(options.pool_gb * 2**30) // 2**30))  # vLLM's CPU KV space is whole GiB
        num_blocks = max(2, options.pool_tokens // VLLM_CPU_BLOCK_SIZE)
        # It refuses a KV cache smaller than one max-length sequence (less a block it keeps).
        max_model_len = min(MAX_MODEL_LEN, (num_blocks - 1) * VLLM_CPU_BLOCK_SIZE)
        base = dataclasses.replace(options.base, env={**options.base.env, "VLLM_CPU_KVCACHE_SPACE": str(kv_gib)},
                                   vllm_args=(*options.base.vllm_args, "--enable-prefix-caching",
                                              "--enable-prompt-tokens-details", "--block-size",
                                              str(VLLM_CPU_BLOCK_SIZE), "--num-gpu-blocks-override", str(num_blocks),
                                              "--max-model-len", str(max_model_len)))
        with vllm_server(base, run_dir) as base_url:
            yield RunningServer(name, base_url, [base_url.removeprefix("http://")])
        return
    with _tier_dir() as tier_dir, _pdserve_stack(name, options, tier_dir, run_dir) as server:
        yield server


@contextlib.contextmanager
def _tier_dir() -> Iterator[Path]:
    """A fresh host-tier directory in /dev/shm for one run: no blocks of an earlier run."""
    directory = Path(tempfile.mkdtemp(prefix="pdserve-bench-tier-", dir="/dev/shm"))
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


@contextlib.contextmanager
def _pdserve_stack(name: str, options: MultiturnServerOptions, tier_dir: Path, run_dir: Path):
    from services.launcher import LocalStack
    from services.launcher.errors import StackError

    env = {"PDSERVE_KV_CACHE_MEMORY_GB": str(options.pool_gb), "PDSERVE_KV_HOST_TIER_DIR": str(tier_dir),
           "PDSERVE_KV_FILE_TIER_DIR": str(tier_dir / "file")}
    if name == "pdserve-tiers":
        env |= {"PDSERVE_KV_HOST_TIER_GB": str(options.host_tier_gb), "PDSERVE_KV_FILE_TIER_GB": str(options.file_tier_gb)}
    else:
        env |= {"PDSERVE_KV_HOST_TIER_GB": "0", "PDSERVE_KV_FILE_TIER_GB": "0", "PDSERVE_KV_PEER_REUSE": "false"}
    base = dataclasses.replace(options.base, env={**options.base.env, **env})
    config = pdserve_stack_config("pdserve", base, run_dir, 0)
    with LocalStack(config) as stack:
        try:
            stack.start()
        except StackError as error:
            raise ServerStartError(f"{name}: {error} (logs {stack.run_dir / 'logs'})") from error
        base_url = f"http://{stack.ready_info['gateway']['http_address']}"
        wait_until_http_ready(f"{base_url}/health", lambda: stack.find_dead_child() is None,
                              base.ready_timeout_s, f"{name} (logs {stack.run_dir / 'logs'})")
        prefills = [stack.ready_info[child.name]["metrics_address"] for child in stack.instances
                    if child.role == "prefill"]
        yield RunningServer(name, base_url, prefills)


Samples = list[tuple[str, dict[str, str], float]]


def scrape(address: str) -> Samples:
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as response:
        text = response.read().decode()
    return [(sample.name, sample.labels, sample.value)
            for family in text_string_to_metric_families(text) for sample in family.samples]


def cache_counters(server: RunningServer) -> dict[str, float]:
    """Prompt tokens looked up and where their KV came from, summed over the scraped servers:
    "queries", "hits" (prefix cache, tiers included) and per tier "<tier>_tokens" (loaded)."""
    totals: dict[str, float] = {}
    for address in server.metrics_addresses:
        samples = scrape(address)
        _add(totals, "queries", _counter(samples, "vllm:prefix_cache_queries_total"))
        _add(totals, "hits", _counter(samples, "vllm:prefix_cache_hits_total"))
        for tier in TIERS:
            _add(totals, f"{tier}_tokens", _counter(samples, "pdserve:kv_tier_recompute_avoided_tokens_total", tier=tier))
    return totals


def _add(totals: dict[str, float], key: str, amount: float) -> None:
    totals[key] = totals.get(key, 0.0) + amount


def _counter(samples: Samples, name: str, **labels: str) -> float:
    """The sum of a counter's samples carrying `labels` (0 when absent)."""
    return sum(value for sample_name, sample_labels, value in samples
               if sample_name == name and labels.items() <= sample_labels.items())
