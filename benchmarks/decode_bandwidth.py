"""Decode-attention bandwidth: the Triton paged decode kernel against a device-to-device copy.

Decode attention is memory-bound: each step reads every cached key and value of the batch
once. This times `decode_attention` on SmolLM2's shapes (9 query heads, 3 KV heads, head dim
64, 16-token blocks, bf16) over shuffled block tables, and reports the bytes of K/V it reads
per second against the achieved bandwidth of `torch.Tensor.copy_` on a buffer of the same
size, counted as usual for a copy: bytes read plus bytes written. Target: >= 80% of the copy.

    python -m benchmarks.decode_bandwidth [--batch 64 --context 4096 --json out.json]
"""

import argparse
import json
from pathlib import Path

import torch

from shared.kv_cache.blocks import blocks_for_tokens

NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE = 9, 3, 64, 16


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=64, help="decoding sequences")
    parser.add_argument("--context", type=int, default=4096, help="tokens of context per sequence")
    parser.add_argument("--dtype", choices=("bfloat16", "float16", "float32"), default="bfloat16")
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    return parser.parse_args(argv)


def time_cuda(function, iterations: int) -> float:
    """Median seconds of one call, by CUDA events, after two warm-up calls."""
    function(), function()
    times = []
    for _ in range(iterations):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        function()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return sorted(times)[len(times) // 2]


def decode_inputs(batch: int, context: int, dtype: torch.dtype, device: str):
    blocks_per_seq = blocks_for_tokens(context, BLOCK_SIZE)
    num_blocks = batch * blocks_per_seq
    shape = (num_blocks, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM)
    key_cache = torch.randn(shape, dtype=dtype, device=device)
    value_cache = torch.randn(shape, dtype=dtype, device=device)
    tables = torch.randperm(num_blocks, device=device).view(batch, blocks_per_seq).to(torch.int32)
    context_lens = torch.full((batch,), context, dtype=torch.int32, device=device)
    query = torch.randn(batch, NUM_HEADS, HEAD_DIM, dtype=dtype, device=device)
    return query, key_cache, value_cache, tables, context_lens


def measure(args: argparse.Namespace) -> dict:
    from shared.attention.triton_kernels.decode_attention import choose_num_splits, decode_attention

    dtype = getattr(torch, args.dtype)
    query, key_cache, value_cache, tables, lens = decode_inputs(args.batch, args.context, dtype, "cuda")
    num_splits = choose_num_splits(args.batch, NUM_KV_HEADS, args.context)
    kv_bytes = 2 * args.batch * args.context * NUM_KV_HEADS * HEAD_DIM * dtype.itemsize
    attention_s = time_cuda(lambda: decode_attention(query, key_cache, value_cache, tables, lens,
                                                     HEAD_DIM ** -0.5, num_splits), args.iterations)
    source = torch.empty(kv_bytes, dtype=torch.uint8, device="cuda")
    target = torch.empty_like(source)
    copy_s = time_cuda(lambda: target.copy_(source), args.iterations)
    attention_gbps, copy_gbps = kv_bytes / attention_s / 1e9, 2 * kv_bytes / copy_s / 1e9
    return {"batch": args.batch, "context": args.context, "dtype": args.dtype, "num_splits": num_splits,
            "kv_bytes": kv_bytes, "attention_ms": attention_s * 1e3, "copy_ms": copy_s * 1e3,
            "attention_gbps": attention_gbps, "copy_gbps": copy_gbps,
            "fraction_of_copy": attention_gbps / copy_gbps}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("decode bandwidth: no GPU")
        return 2
    result = measure(args)
    print(f"decode attention {result['attention_gbps']:.0f} GB/s of K/V read, device copy "
          f"{result['copy_gbps']:.0f} GB/s read + written: {100 * result['fraction_of_copy']:.0f}% "
          f"(batch {args.batch}, context {args.context}, {result['num_splits']} splits)")
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
