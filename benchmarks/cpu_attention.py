"""The C++ paged attention kernel on the CPU: decode bandwidth and deterministic prompt rows.

Every path of the kernel that this machine runs (portable, avx512f, avx512-bf16, amx; forced
in turn) is timed side by side.

Decode: a batch of sequences (SmolLM2's shapes: 9 query heads, 3 KV heads, head dim 64,
16-token blocks, shuffled block tables) one query row each; reported as the bytes of keys and
values read per second against the streaming bandwidth measured in the same run (copying a
256 MiB tensor, bytes read + written, benchmarks/roofline.py). Each call reads another
layer's cache, rotating over at least 1 GiB of them, so the keys come from memory as in a
model step, not from a cache left warm by the previous call.

Prompt rows (deterministic mode's prompt attention): one prompt's rows each over the context
up to its own position, passed as one segment (the kernel walks the context once for all the
rows) and as one row each (every row streams its context on its own); same bits either way.

`--baseline-source FILE` also builds and times another version of the kernel source (e.g. the
one on main: `git show main:shared/attention/csrc/paged_decode.cpp > /tmp/before.cpp`) in the
same run, alternating, so the two compare on the same machine state.

    python -m benchmarks.cpu_attention [--batch 64 --contexts 256 1024 --prompt-len 256]
"""

import argparse
import ctypes
import json
from pathlib import Path

import torch

from benchmarks.machine import print_machine
from benchmarks.roofline import best_seconds, stream_gbps
from shared.attention.native_decode import NativePagedDecode, load_native_decode
from shared.kv_cache.blocks import blocks_for_tokens
from shared.native.build import shared_library
from benchmarks.engine_flags import add_engine_arguments

NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE = 9, 3, 64, 16


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=64, help="decoding sequences")
    parser.add_argument("--contexts", type=int, nargs="+", default=[256, 1024], help="tokens of context per sequence")
    parser.add_argument("--prompt-len", type=int, default=256, help="prompt rows (0: skip)")
    add_engine_arguments(parser, "dtype", "num_threads", num_threads=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rotate-mib", type=int, default=1024, help="layer caches each decode timing cycles through")
    parser.add_argument("--baseline-source", type=Path, help="another kernel source to time alongside")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    return parser.parse_args(argv)


class LegacyDecode:
    """A kernel source from before segments (pdserve_paged_decode_*: one row per sequence)."""

    def __init__(self, library: ctypes.CDLL):
        self._functions = {torch.bfloat16: library.pdserve_paged_decode_bf16,
                           torch.float32: library.pdserve_paged_decode_f32}
        for function in self._functions.values():
            function.restype = None
            function.argtypes = [ctypes.c_void_p] * 6 + [ctypes.c_int] * 6 + [ctypes.c_float, ctypes.c_int]

    def __call__(self, query, key_cache, value_cache, block_tables, context_lens, scale, query_lens=None):
        assert query_lens is None, "the baseline kernel takes one row per sequence"
        output = torch.empty_like(query)
        self._functions[query.dtype](
            query.data_ptr(), key_cache.data_ptr(), value_cache.data_ptr(), block_tables.data_ptr(),
            context_lens.data_ptr(), output.data_ptr(), query.shape[0], NUM_HEADS, NUM_KV_HEADS, HEAD_DIM,
            BLOCK_SIZE, block_tables.shape[1], scale, torch.get_num_threads())
        return output


class UnforcedDecode:
    """A kernel source with segments but before its path could be forced (no path argument)."""

    def __init__(self, library: ctypes.CDLL):
        self._functions = {torch.bfloat16: library.pdserve_paged_attention_bf16,
                           torch.float32: library.pdserve_paged_attention_f32}
        for function in self._functions.values():
            function.restype = None
            function.argtypes = [ctypes.c_void_p] * 7 + [ctypes.c_int] * 6 + [ctypes.c_float, ctypes.c_int]

    def __call__(self, query, key_cache, value_cache, block_tables, context_lens, scale, query_lens=None):
        output = torch.empty_like(query)
        self._functions[query.dtype](
            query.data_ptr(), key_cache.data_ptr(), value_cache.data_ptr(), block_tables.data_ptr(),
            context_lens.data_ptr(), None if query_lens is None else query_lens.data_ptr(), output.data_ptr(),
            block_tables.shape[0], NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE, block_tables.shape[1], scale,
            torch.get_num_threads())
        return output


def baseline_kernel(library: ctypes.CDLL):
    """The wrapper for another version of the kernel source, by the entry points it has."""
    if hasattr(library, "pdserve_paged_attention_path_available"):
        return NativePagedDecode(library)
    if hasattr(library, "pdserve_paged_attention_bf16"):
        return UnforcedDecode(library)
    return LegacyDecode(library)


class ForcedPath:
    """The kernel with one of its paths forced."""

    def __init__(self, kernel: NativePagedDecode, path: str):
        self.kernel, self.path = kernel, path

    def __call__(self, *args, **kwargs):
        return self.kernel(*args, **kwargs, path=self.path)


def load_kernels(baseline_source: Path | None, dtype: torch.dtype = torch.bfloat16) -> dict:
    """Every path of this kernel this machine runs for SmolLM2's shapes (fastest last), and the
    baseline source's kernel."""
    kernel = load_native_decode()
    if kernel is None:
        raise SystemExit("the native kernel did not build (needs g++; PDSERVE_NATIVE_KERNELS unset)")
    kernels = {f"{path} path": ForcedPath(kernel, path)
               for path in kernel.available_paths(NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE, dtype)}
    if baseline_source is not None:
        kernels["baseline"] = baseline_kernel(ctypes.CDLL(str(shared_library(baseline_source.resolve()))))
    return kernels


def layer_caches(num_blocks: int, dtype: torch.dtype, rotate_mib: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    shape = (num_blocks, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM)
    layer_bytes = 2 * num_blocks * BLOCK_SIZE * NUM_KV_HEADS * HEAD_DIM * dtype.itemsize
    num_layers = max(2, -(-(rotate_mib << 20) // layer_bytes))
    return [(torch.randn(shape).to(dtype), torch.randn(shape).to(dtype)) for _ in range(num_layers)]


def decode_gbps(kernels: dict, batch: int, context: int, dtype: torch.dtype, args) -> dict[str, float]:
    blocks_per_seq = blocks_for_tokens(context, BLOCK_SIZE)
    caches = layer_caches(batch * blocks_per_seq, dtype, args.rotate_mib)
    tables = torch.randperm(batch * blocks_per_seq).view(batch, blocks_per_seq).to(torch.int32)
    lens = torch.full((batch,), context, dtype=torch.int32)
    query = torch.randn(batch, NUM_HEADS, HEAD_DIM).to(dtype)
    kv_bytes = 2 * batch * context * NUM_KV_HEADS * HEAD_DIM * dtype.itemsize
    results = {}
    for name, kernel in kernels.items():
        def every_layer():
            for key_cache, value_cache in caches:
                kernel(query, key_cache, value_cache, tables, lens, HEAD_DIM ** -0.5)
        results[name] = kv_bytes * len(caches) / best_seconds(every_layer, args.repeats) / 1e9
    return results


def prompt_rows_ms(kernels: dict, prompt_len: int, dtype: torch.dtype, repeats: int) -> dict[str, float]:
    """Milliseconds per layer for one prompt's rows, as one segment and as one row each."""
    blocks = blocks_for_tokens(prompt_len, BLOCK_SIZE)
    key_cache, value_cache = layer_caches(blocks, dtype, 0)[0]
    table = torch.randperm(blocks)[None, :].to(torch.int32)
    query = torch.randn(prompt_len, NUM_HEADS, HEAD_DIM).to(dtype)
    row_tables = table.expand(prompt_len, -1).contiguous()
    row_lens = torch.arange(1, prompt_len + 1, dtype=torch.int32)
    whole = (torch.tensor([prompt_len], dtype=torch.int32), torch.tensor([prompt_len], dtype=torch.int32))
    results = {}
    for name, kernel in kernels.items():
        calls = {"one row each": lambda: kernel(query, key_cache, value_cache, row_tables, row_lens, 0.125)}
        if not isinstance(kernel, (LegacyDecode, UnforcedDecode)):
            calls["one segment"] = lambda: kernel(query, key_cache, value_cache, table, whole[0], 0.125, whole[1])
        for how, call in calls.items():
            results[f"{name}, {how}"] = best_seconds(call, repeats) * 1e3
    return results


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.num_threads)
    dtype = getattr(torch, args.dtype)
    kernels = load_kernels(args.baseline_source, dtype)
    result = {"threads": args.num_threads, "dtype": args.dtype, "batch": args.batch,
              "default_path": load_native_decode().path(NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE, dtype),
              "stream_gbps": stream_gbps(), "decode": {}}
    result["machine"] = print_machine(probe_onednn=False)
    print(f"streaming bandwidth {result['stream_gbps']:.1f} GB/s (read + written); the engine's path here: "
          f"{result['default_path']}; {args.num_threads} threads, {args.dtype}")
    print("\n| decode, batch %d | context | GB/s of K/V | share of streaming |\n| --- | --- | --- | --- |" % args.batch)
    for context in args.contexts:
        figures = decode_gbps(kernels, args.batch, context, dtype, args)
        result["decode"][context] = figures
        for name, gbps in figures.items():
            print(f"| {name} | {context} | {gbps:.1f} | {gbps / result['stream_gbps']:.0%} |")
    if args.prompt_len:
        result["prompt_ms"] = prompt_rows_ms(kernels, args.prompt_len, dtype, args.repeats)
        print(f"\n| prompt of {args.prompt_len} rows, one layer | ms |\n| --- | --- |")
        for name, ms in result["prompt_ms"].items():
            print(f"| {name} | {ms:.2f} |")
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
