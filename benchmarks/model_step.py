"""Time one model step at SmolLM2-135M's shapes with random weights (no model files needed).

    .venv/bin/python -m benchmarks.model_step [--batch 64] [--context 256] [--prefill-len 512]

Measures a decode step (`--batch` sequences, contexts around `--context` tokens, one new token
each) and a single-prompt prefill step of `--prefill-len` tokens, and splits each into linear
layers (incl. the LM head), attention (cache writes, gathers, softmax) and the rest (norms,
RoPE, activations, Python). `--profile` adds torch.profiler's top operators;
`--transformers` also times transformers' LlamaForCausalLM on the same shapes (a prefill
forward and a decode step with its DynamicCache), for a ratio measured under the same load;
`--roofline` prints each part against the machine's measured matmul peak and streaming
bandwidth (benchmarks/roofline.py).
"""

import argparse
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from benchmarks.machine import print_machine
from shared.attention.metadata import AttentionMetadata
from shared.kv_cache.blocks import blocks_for_tokens
from shared.kv_cache.layout import KVCacheLayout
from shared.model.config import ModelConfig
from shared.model.cpu_runtime import configure_cpu_runtime
from shared.model.describe_paths import describe_model
from shared.model.llama import LlamaForCausalLM
from shared.model.packed_linear import PackedGatedMLP, PackedLinear, pack_for_cpu
from benchmarks.engine_flags import add_engine_arguments

SMOLLM2_135M = ModelConfig(
    vocab_size=49152, hidden_size=576, intermediate_size=1536, num_layers=30, num_heads=9,
    num_kv_heads=3, head_dim=64, rope_theta=100000.0, rms_norm_eps=1e-5,
    max_position_embeddings=8192, tie_word_embeddings=True, bos_token_id=1, eos_token_ids=(2,))


def build_random_model(config: ModelConfig, dtype: torch.dtype) -> LlamaForCausalLM:
    """The model with N(0, 0.02) weights, packed as `load_model` packs a real one."""
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    model.to_empty(device="cpu").to(dtype)
    for param in model.parameters():
        nn.init.normal_(param, std=0.02)
    model.tie_weights()
    model.eval().requires_grad_(False)
    pack_for_cpu(model)
    return model


class StepInputs:
    """input_ids, positions, metadata and logits rows of one step, plus a KV cache to run it on."""

    def __init__(self, config: ModelConfig, dtype: torch.dtype, block_size: int,
                 context_lens: list[int], query_lens: list[int], num_decodes: int):
        self.context_lens = context_lens
        blocks_per_seq = [blocks_for_tokens(length, block_size) for length in context_lens]
        block_ids = torch.randperm(sum(blocks_per_seq)).split(blocks_per_seq)
        self.kv_cache = KVCacheLayout(config.num_layers, sum(blocks_per_seq), block_size, config.num_kv_heads,
                                      config.head_dim, dtype).allocate().normal_()
        positions = [torch.arange(c - q, c) for c, q in zip(context_lens, query_lens)]
        self.positions = torch.cat(positions)
        self.input_ids = torch.randint(0, config.vocab_size, self.positions.shape)
        slots = [ids[p // block_size] * block_size + p % block_size for ids, p in zip(block_ids, positions)]
        self.metadata = AttentionMetadata(
            slot_mapping=torch.cat(slots), num_decode_tokens=num_decodes,
            decode_block_tables=_padded_tables(block_ids[:num_decodes]),
            decode_context_lens=torch.tensor(context_lens[:num_decodes]),
            prefill_query_lens=query_lens[num_decodes:], prefill_context_lens=context_lens[num_decodes:],
            prefill_block_tables=list(block_ids[num_decodes:]))
        ends = torch.tensor(query_lens).cumsum(0)
        self.logits_indices = ends - 1

    def run(self, model: LlamaForCausalLM) -> torch.Tensor:
        return model(self.input_ids, self.positions, self.kv_cache, self.metadata, self.logits_indices)


def _padded_tables(tables: tuple[torch.Tensor, ...]) -> torch.Tensor:
    width = max((len(table) for table in tables), default=0)
    return torch.stack([nn.functional.pad(table, (0, width - len(table))) for table in tables]) \
        if tables else torch.zeros(0, 0, dtype=torch.long)


def decode_inputs(config: ModelConfig, dtype: torch.dtype, block_size: int, batch: int, context: int) -> StepInputs:
    """`batch` decodes with contexts drawn uniformly in [0.75, 1.25] x `context`."""
    context_lens = torch.randint(context * 3 // 4, context * 5 // 4 + 1, (batch,)).tolist()
    return StepInputs(config, dtype, block_size, context_lens, [1] * batch, num_decodes=batch)


def prefill_inputs(config: ModelConfig, dtype: torch.dtype, block_size: int, length: int) -> StepInputs:
    return StepInputs(config, dtype, block_size, [length], [length], num_decodes=0)


@dataclass
class Timing:
    median_ms: float
    # The fastest run: on a machine shared with other work, the best measure of the code.
    best_ms: float

    def __str__(self) -> str:
        return f"median {self.median_ms:.1f} ms, best {self.best_ms:.1f} ms"


def time_runs(run: Callable[[], object], repeats: int) -> Timing:
    for _ in range(2):
        run()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        times.append((time.perf_counter() - started) * 1e3)
    return Timing(statistics.median(times), min(times))


class Breakdown:
    """Wall time spent inside linear layers (a packed MLP counts whole, its activation included)
    and inside the attention backend."""

    def __init__(self, model: LlamaForCausalLM):
        self.seconds = {"linear": 0.0, "attention": 0.0}
        self._started: dict[int, float] = {}
        inside_packed_mlps = {id(child) for module in model.modules() if isinstance(module, PackedGatedMLP)
                              for child in module.children()}
        for module in model.modules():
            if isinstance(module, (nn.Linear, PackedLinear, PackedGatedMLP)) and id(module) not in inside_packed_mlps:
                module.register_forward_pre_hook(self._start)
                module.register_forward_hook(self._stop)
        backend = model.attn_backend
        backend.forward = self._timed(backend.forward)
        backend.prepare = self._timed(backend.prepare)

    def _start(self, module, args):
        self._started[id(module)] = time.perf_counter()

    def _stop(self, module, args, output):
        self.seconds["linear"] += time.perf_counter() - self._started.pop(id(module))

    def _timed(self, method):
        def timed(*args, **kwargs):
            started = time.perf_counter()
            result = method(*args, **kwargs)
            self.seconds["attention"] += time.perf_counter() - started
            return result
        return timed

    def measure(self, run: Callable[[], object], repeats: int) -> dict[str, float]:
        """The split, in ms, of the fastest of `repeats` runs."""
        run()
        splits = []
        for _ in range(repeats):
            self.seconds = dict.fromkeys(self.seconds, 0.0)
            started = time.perf_counter()
            run()
            total = (time.perf_counter() - started) * 1e3
            parts = {name: seconds * 1e3 for name, seconds in self.seconds.items()}
            splits.append({**parts, "rest": total - sum(parts.values())})
        return min(splits, key=lambda parts: sum(parts.values()))


def transformers_ms(config: ModelConfig, dtype: torch.dtype, batch: int, context: int,
                    prefill_len: int, repeats: int) -> dict[str, Timing]:
    """Times of transformers' prefill forward and of one decode step at `context` tokens."""
    from transformers import LlamaConfig
    from transformers import LlamaForCausalLM as HFLlamaForCausalLM
    hf_config = LlamaConfig(
        vocab_size=config.vocab_size, hidden_size=config.hidden_size, intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_layers, num_attention_heads=config.num_heads,
        num_key_value_heads=config.num_kv_heads, max_position_embeddings=config.max_position_embeddings,
        rope_theta=config.rope_theta, rms_norm_eps=config.rms_norm_eps, tie_word_embeddings=True)
    model = HFLlamaForCausalLM(hf_config).to(dtype).eval()
    prompt = torch.randint(0, config.vocab_size, (1, prefill_len))
    cache = model(torch.randint(0, config.vocab_size, (batch, context)), use_cache=True).cache
    next_ids = torch.randint(0, config.vocab_size, (batch, 1))

    def decode_step():
        model(next_ids, cache=cache, use_cache=True)
        cache.crop(-1)
    return {"prefill": time_runs(lambda: model(prompt), repeats), "decode": time_runs(decode_step, repeats)}


def profile_table(run: Callable[[], object], rows: int = 15) -> str:
    from torch.profiler import ProfilerActivity, profile
    run()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        run()
    return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--prefill-len", type=int, default=512)
    parser.add_argument("--block-size", type=int, default=16)
    add_engine_arguments(parser, "dtype", "num_threads", num_threads=2)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--no-malloc-tuning", action="store_true", help="leave glibc's malloc thresholds alone")
    parser.add_argument("--profile", action="store_true", help="also print torch.profiler's top operators")
    parser.add_argument("--transformers", action="store_true", help="also time transformers on the same shapes")
    parser.add_argument("--roofline", action="store_true",
                        help="also measure the machine's matmul peak and streaming bandwidth and print each "
                             "part against them (benchmarks/roofline.py)")
    args = parser.parse_args()
    torch.set_num_threads(args.num_threads)
    if not args.no_malloc_tuning:
        configure_cpu_runtime()
    torch.manual_seed(0)
    dtype = getattr(torch, args.dtype)
    model = build_random_model(SMOLLM2_135M, dtype)
    steps = {
        f"decode batch {args.batch}, context ~{args.context}": decode_inputs(
            SMOLLM2_135M, dtype, args.block_size, args.batch, args.context),
        f"prefill {args.prefill_len} tokens": prefill_inputs(SMOLLM2_135M, dtype, args.block_size, args.prefill_len),
    }
    runs = {name: (lambda inputs=inputs: inputs.run(model)) for name, inputs in steps.items()}
    with torch.inference_mode():
        totals = {name: time_runs(run, args.repeats) for name, run in runs.items()}
        breakdown = Breakdown(model)
        parts = {name: breakdown.measure(run, args.repeats) for name, run in runs.items()}
        tables = {name: profile_table(run) for name, run in runs.items()} if args.profile else {}
    print_machine(describe_model(model, args.block_size))
    print(f"SmolLM2-135M shapes, {args.dtype}, {torch.get_num_threads()} threads, block size {args.block_size}")
    for name in runs:
        split = ", ".join(f"{part} {ms:.1f}" for part, ms in parts[name].items())  # of the best run
        print(f"{name}: {totals[name]} (of {args.repeats}); breakdown ms: {split}")
        if name in tables:
            print(tables[name])
    if args.roofline:
        from benchmarks.roofline import print_roofline, roofline_rows
        (decode_name, decode), (prefill_name, _) = steps.items()
        print_roofline(roofline_rows(SMOLLM2_135M, dtype, decode.context_lens, parts[decode_name], args.prefill_len,
                                     totals[prefill_name].best_ms))
    if args.transformers:
        with torch.inference_mode():
            theirs = transformers_ms(SMOLLM2_135M, dtype, args.batch, args.context, args.prefill_len, args.repeats)
        ours = dict(zip(["decode", "prefill"], totals.values()))
        for kind in ("decode", "prefill"):
            ratio = theirs[kind].best_ms / ours[kind].best_ms
            print(f"transformers {kind}: {theirs[kind]}; best vs best, pdserve is {ratio:.2f}x as fast")


if __name__ == "__main__":
    main()
