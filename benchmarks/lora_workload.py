"""What every part of the multi-LoRA benchmark (benchmarks/lora.py) shares: random adapters in
peft's format, the prompts, how requests are spread over adapters, and the table.

Adapters are random (A and B both non-zero), rank `rank` on the seven projections of every
layer, written straight in peft's format (adapter_config.json + adapter_model.safetensors), so
pdserve, peft and vLLM all load them; peft itself is not needed.
"""

import json
import statistics
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file

from shared.model.config import ModelConfig

MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
TOPICS = ["the sea", "a city at night", "autumn", "a train journey", "mountains", "a library", "coffee",
          "the moon", "rain", "a garden", "winter", "a market", "the desert", "a river", "music", "bread"]


@dataclass(frozen=True)
class Adapter:
    name: str
    int_id: int  # >= 1
    path: str


def module_dims(config: ModelConfig) -> dict[str, tuple[int, int]]:
    attention, kv = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
    hidden, inter = config.hidden_size, config.intermediate_size
    return {"q_proj": (hidden, attention), "k_proj": (hidden, kv), "v_proj": (hidden, kv),
            "o_proj": (attention, hidden), "gate_proj": (hidden, inter), "up_proj": (hidden, inter),
            "down_proj": (inter, hidden)}


def write_adapter(folder: Path, config: ModelConfig, rank: int, seed: int) -> Path:
    """A random adapter in peft's format (A and B both non-zero)."""
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(config.num_layers):
        for module, (fan_in, fan_out) in module_dims(config).items():
            parent = "self_attn" if module in ("q_proj", "k_proj", "v_proj", "o_proj") else "mlp"
            prefix = f"base_model.model.model.layers.{layer}.{parent}.{module}"
            tensors[f"{prefix}.lora_A.weight"] = torch.randn(rank, fan_in, generator=generator) * 0.01
            tensors[f"{prefix}.lora_B.weight"] = torch.randn(fan_out, rank, generator=generator) * 0.01
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    (folder / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": rank, "lora_alpha": 2 * rank,
        "target_modules": list(MODULES), "bias": "none", "lora_dropout": 0.0}))
    return folder


def write_adapters(root: Path, config: ModelConfig, count: int, rank: int) -> list[Adapter]:
    return [Adapter(f"bench{index}", index + 1, str(write_adapter(root / f"a{index}", config, rank, index)))
            for index in range(count)]


def spread(num_requests: int, adapters: list[Adapter], count: int) -> list[Adapter | None]:
    """Request i's adapter: adapter i % count (count 0: the base model for every request)."""
    return [adapters[index % count] if count else None for index in range(num_requests)]


def chat_prompts(num_prompts: int) -> list[list[dict]]:
    return [[{"role": "user", "content": f"Write a short poem about {TOPICS[index % len(TOPICS)]} "
                                         f"(number {index})."}] for index in range(num_prompts)]


def configurations(adapter_counts: list[int]) -> list[tuple[str, int]]:
    """(label, adapters per batch) of the rows after "base": base requests on a LoRA engine, then
    each adapter count."""
    return [("lora, base requests", 0)] + [(f"lora, {count} adapters", count) for count in adapter_counts]


def format_rows(title: str, rates: dict[str, list[float]]) -> str:
    """One table: per row the median output tok/s of its runs and the median against "base"
    (each run's ratio to the base run of the same round; rounds interleave the rows)."""
    base = rates["base"]
    lines = [title, f"{'engine':<24} {'output tok/s':>12} {'vs base':>8}   runs (tok/s)"]
    for label, runs in rates.items():
        ratio = statistics.median(run / base[index] - 1 for index, run in enumerate(runs))
        shown = "" if label == "base" else f"{100 * ratio:+7.1f}%"
        lines.append(f"{label:<24} {statistics.median(runs):>12.1f} {shown:>8}   "
                     + " ".join(f"{run:.1f}" for run in runs))
    return "\n".join(lines)
