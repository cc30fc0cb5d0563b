"""The roofline table of `python -m benchmarks.model_step --roofline`: each part of a model
step against what this machine can do, measured in the same run.

Machine figures are measured, not taken from a data sheet: the matmul peak is the best GFLOP/s
of a large oneDNN-packed matmul (2048 x 2048 x 2048) on the step's threads, in the dtype the
linear layers compute in (fp32 for a bf16 model on a CPU without bf16 hardware:
shared.native.cpu_matmul), the
streaming bandwidth the best read+write bytes/s of copying a 256 MiB tensor. Work per part:
linear layers 2 x rows x weights (the LM head only on the rows that sample), decode attention
the bytes of keys and values its contexts hold (every layer), a prefill step 2 x tokens x
weights plus the causal attention's 4 x heads x head_dim x (n (n + 1) / 2) per layer.
"""

import time

import torch

from shared.model.config import ModelConfig
from shared.native.cpu_matmul import cpu_matmul_dtype

PEAK_SIZE = 2048
COPY_BYTES = 256 << 20


def best_seconds(run, repeats: int = 5) -> float:
    run()
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - started)
    return best


def matmul_peak_gflops(dtype: torch.dtype) -> float:
    weight = torch.randn(PEAK_SIZE, PEAK_SIZE).to(dtype)
    rows = torch.randn(PEAK_SIZE, PEAK_SIZE).to(dtype)
    if torch.backends.mkldnn.is_available():
        packed = torch.ops.mkldnn._reorder_linear_weight(weight)
        seconds = best_seconds(lambda: torch.ops.mkldnn._linear_pointwise(rows, packed, None, "none", [], ""))
    else:
        seconds = best_seconds(lambda: torch.nn.functional.linear(rows, weight))
    return 2 * PEAK_SIZE ** 3 / seconds / 1e9


def stream_gbps() -> float:
    source = torch.empty(COPY_BYTES, dtype=torch.uint8).fill_(1)
    target = torch.empty_like(source)
    return 2 * COPY_BYTES / best_seconds(lambda: target.copy_(source)) / 1e9


def layer_weights(config: ModelConfig) -> int:
    """Weights of one decoder layer's linear layers."""
    qkv = config.hidden_size * (config.num_heads + 2 * config.num_kv_heads) * config.head_dim
    out = config.num_heads * config.head_dim * config.hidden_size
    mlp = 3 * config.hidden_size * config.intermediate_size
    return qkv + out + mlp


def linear_gflop(config: ModelConfig, num_rows: int, num_logit_rows: int) -> float:
    body = 2 * num_rows * config.num_layers * layer_weights(config)
    head = 2 * num_logit_rows * config.hidden_size * config.vocab_size
    return (body + head) / 1e9


def decode_kv_gb(config: ModelConfig, context_lens: list[int], bytes_per_value: int) -> float:
    per_token = 2 * config.num_layers * config.num_kv_heads * config.head_dim * bytes_per_value
    return sum(context_lens) * per_token / 1e9


def prefill_gflop(config: ModelConfig, length: int) -> float:
    attention = 4 * config.num_heads * config.head_dim * length * (length + 1) / 2 * config.num_layers
    return linear_gflop(config, length, 1) + attention / 1e9


def roofline_rows(config: ModelConfig, dtype: torch.dtype, decode_lens: list[int], decode_parts: dict[str, float],
                  prefill_len: int, prefill_ms: float) -> list[tuple[str, str, float, str, float, float]]:
    """(part, unit, work, achieved per second, machine figure, share) rows."""
    compute_dtype = cpu_matmul_dtype(dtype)
    peak, bandwidth = matmul_peak_gflops(compute_dtype), stream_gbps()
    peak_name = f"{str(compute_dtype).removeprefix('torch.')} matmul peak"
    linear = linear_gflop(config, len(decode_lens), len(decode_lens)) / (decode_parts["linear"] / 1e3)
    kv = decode_kv_gb(config, decode_lens, torch.finfo(dtype).bits // 8) / (decode_parts["attention"] / 1e3)
    prefill = prefill_gflop(config, prefill_len) / (prefill_ms / 1e3)
    return [
        (f"linear layers, decode batch {len(decode_lens)}", "GFLOP/s", linear, peak_name, peak, linear / peak),
        (f"decode attention, batch {len(decode_lens)}", "GB/s", kv, "streaming", bandwidth, kv / bandwidth),
        (f"prefill {prefill_len} tokens (whole step)", "GFLOP/s", prefill, peak_name, peak, prefill / peak),
    ]


def print_roofline(rows) -> None:
    print("\n| part | achieved | machine (measured) | share |\n| --- | --- | --- | --- |")
    for part, unit, achieved, machine, figure, share in rows:
        print(f"| {part} | {achieved:.1f} {unit} | {machine} {figure:.1f} {unit} | {share:.0%} |")
