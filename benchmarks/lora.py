"""Multi-LoRA benchmark: output tokens/s with 1, 4 and 16 adapters mixed uniformly in one batch,
against the base model alone (offline engine).

Run by `make bench-lora` (`python -m benchmarks.lora [flags]`).

Workload: --batch-size different chat prompts, greedy, --max-tokens each (EOS ignored, so every
run generates the same number of tokens). Rows:
- "base": an engine without LoRA (the fused, packed MLP of the plain engine);
- "lora, base requests": an engine with enable_lora, every request on the base model (what
  enabling LoRA costs requests that use none);
- "lora, N adapters": the same engine, request i on adapter i % N (max_loras = N, so all fit in
  one step).
Adapters are random, rank --rank on the seven projections of every layer, written straight in
peft's format (adapter_config.json + adapter_model.safetensors) into a temporary folder; peft is
not needed. Best of --repeats runs; each engine warms up once first. Figures swing with other
load on the machine: run it on an idle one.
"""

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

from shared.engine import LLM, LoRARequest, SamplingParams  # noqa: E402
from shared.model.config import ModelConfig  # noqa: E402
from shared.model.default_model import resolve_model  # noqa: E402
from shared.tokenization.chat import apply_chat_template  # noqa: E402

MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
TOPICS = ["the sea", "a city at night", "autumn", "a train journey", "mountains", "a library", "coffee",
          "the moon", "rain", "a garden", "winter", "a market", "the desert", "a river", "music", "bread"]


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
            parent = "self_attn" if module.endswith(("q_proj", "k_proj", "v_proj", "o_proj")) else "mlp"
            prefix = f"base_model.model.model.layers.{layer}.{parent}.{module}"
            tensors[f"{prefix}.lora_A.weight"] = torch.randn(rank, fan_in, generator=generator) * 0.01
            tensors[f"{prefix}.lora_B.weight"] = torch.randn(fan_out, rank, generator=generator) * 0.01
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    (folder / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank, "target_modules": list(MODULES), "bias": "none"}))
    return folder


def prompts(batch_size: int) -> list[list[dict]]:
    return [[{"role": "user", "content": f"Write a short poem about {TOPICS[index % len(TOPICS)]} (number {index})."}]
            for index in range(batch_size)]


def tokens_per_s(llm: LLM, conversations, params: SamplingParams, adapters, repeats: int) -> float:
    """Best output tokens/s of `repeats` runs of the whole batch, after one warm-up run."""
    texts = [apply_chat_template(llm.tokenizer, conversation) for conversation in conversations]
    llm.generate(texts, params, lora_request=adapters)
    best = 0.0
    for _ in range(repeats):
        started = time.perf_counter()
        outputs = llm.generate(texts, params, lora_request=adapters)
        elapsed = time.perf_counter() - started
        best = max(best, sum(len(output.outputs[0].token_ids) for output in outputs) / elapsed)
    return best


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=None, help="HF folder or GGUF (default: the bundled SmolLM2)")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--adapters", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--num-threads", type=int, default=None)
    args = parser.parse_args(argv)

    folder = resolve_model(args.model)
    config = ModelConfig.from_folder(folder)
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
    conversations = prompts(args.batch_size)
    common = dict(model=str(folder), dtype=args.dtype, num_threads=args.num_threads)
    rows = []
    with tempfile.TemporaryDirectory(prefix="pdserve-bench-lora-") as root:
        adapters = [LoRARequest(f"bench{index}", index + 1, str(write_adapter(Path(root) / f"a{index}", config,
                                                                                   args.rank, index)))
                    for index in range(max(args.adapters))]
        with LLM(**common) as base:
            rows.append(("base", tokens_per_s(base, conversations, params, None, args.repeats)))
        max_loras = max(args.adapters)
        with LLM(**common, enable_lora=True, max_loras=max_loras, max_lora_rank=args.rank) as llm:
            rows.append(("lora, base requests", tokens_per_s(llm, conversations, params, [None] * args.batch_size,
                                                             args.repeats)))
            for count in args.adapters:
                mixed = [adapters[index % count] for index in range(args.batch_size)]
                rows.append((f"lora, {count} adapters", tokens_per_s(llm, conversations, params, mixed,
                                                                     args.repeats)))
    base_rate = rows[0][1]
    print(f"{folder.name}, {args.dtype}, batch {args.batch_size}, {args.max_tokens} tokens each, rank {args.rank}, "
          f"{torch.get_num_threads()} threads")
    print(f"{'engine':<24} {'output tok/s':>12} {'vs base':>8}")
    for label, rate in rows:
        print(f"{label:<24} {rate:>12.1f} {100 * (rate / base_rate - 1):>+7.1f}%")


if __name__ == "__main__":
    main()
