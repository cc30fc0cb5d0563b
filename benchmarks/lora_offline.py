"""The offline part of the multi-LoRA benchmark: pdserve's `LLM` (and, with --vllm-python,
vLLM's) on one batch, the configurations interleaved round by round.

Two engines live side by side: one without LoRA ("base": the fused, packed MLP of the plain
engine) and one with enable_lora and max_loras = the largest adapter count. Each round runs
every row once, in order (base, lora with base requests, then each adapter count), so a burst
of other load on a shared machine hits every row alike; ratios are taken within a round.
"""

import json
import subprocess
import tempfile
import time
from pathlib import Path

from benchmarks.lora_workload import Adapter, configurations, spread
from shared.engine import LLM, LoRARequest, SamplingParams
from shared.tokenization.chat import apply_chat_template

BLOCK_SIZE = 16
VLLM_PEER = Path(__file__).with_name("lora_vllm_peer.py")


def _lora_requests(adapters: list[Adapter | None]) -> list[LoRARequest | None]:
    return [None if adapter is None else LoRARequest(adapter.name, adapter.int_id, adapter.path)
            for adapter in adapters]


def _rate(llm: LLM, texts: list[str], params: SamplingParams, requests) -> float:
    started = time.perf_counter()
    outputs = llm.generate(texts, params, lora_request=requests)
    elapsed = time.perf_counter() - started
    return sum(len(output.outputs[0].token_ids) for output in outputs) / elapsed


def run_pdserve(folder: Path, dtype: str, num_threads: int | None, conversations, max_tokens: int,
                adapters: list[Adapter], counts: list[int], rank: int, rounds: int) -> dict[str, list[float]]:
    """Output tok/s per row, one figure per round."""
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    # KV blocks for every request at once (prompts < 256 tokens), not the default pool: two
    # engines live side by side, on a machine that may be short of memory.
    num_blocks = len(conversations) * -(-(256 + max_tokens) // BLOCK_SIZE)
    common = dict(model=str(folder), dtype=dtype, num_threads=num_threads, num_blocks=num_blocks,
                  block_size=BLOCK_SIZE)
    rows = configurations(counts)
    rates: dict[str, list[float]] = {"base": []} | {label: [] for label, _ in rows}
    with LLM(**common) as base, LLM(**common, enable_lora=True, max_loras=max(counts), max_lora_rank=rank) as llm:
        texts = [apply_chat_template(llm.tokenizer, conversation) for conversation in conversations]
        plans = [(label, _lora_requests(spread(len(texts), adapters, count))) for label, count in rows]
        warm_up = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)  # oneDNN's shapes, adapters read
        base.generate(texts, warm_up)
        for _, requests in plans:
            llm.generate(texts, warm_up, lora_request=requests)
        for _ in range(rounds):
            rates["base"].append(_rate(base, texts, params, None))
            for label, requests in plans:
                rates[label].append(_rate(llm, texts, params, requests))
    return rates


def run_vllm(vllm_python: Path, folder: Path, dtype: str, texts: list[str], max_tokens: int,
             adapters: list[Adapter], counts: list[int], rank: int, rounds: int) -> dict[str, list[float]]:
    """The same rows on vLLM's offline engine, in vLLM's own virtualenv (lora_vllm_peer.py)."""
    with tempfile.TemporaryDirectory(prefix="pdserve-lora-vllm-") as root:
        request, result = Path(root) / "request.json", Path(root) / "result.json"
        request.write_text(json.dumps({
            "model": str(folder), "dtype": dtype, "prompts": texts, "max_tokens": max_tokens, "rank": rank,
            "rounds": rounds, "rows": [[label, count] for label, count in configurations(counts)],
            "adapters": [[adapter.name, adapter.int_id, adapter.path] for adapter in adapters]}))
        subprocess.run([str(vllm_python), str(VLLM_PEER), str(request), str(result)], check=True)
        return json.loads(result.read_text())
