"""The C++ paged decode kernel against a float64 reference, on each of its paths.

SmolLM2's shapes (9 query heads on 3 KV heads, head dim 64, blocks of 16) and others: head dims
16 to 128, 1 to 16 query heads per KV head, blocks of 1 to 64, and context lengths of 1 and
ending inside, at and just past a 16-token tile. Blocks are shuffled over a cache full of other
data. Every test runs on every path this machine can execute for the shapes (portable always;
avx512f, avx512-bf16 and amx where the CPU has them), each forced in turn.
"""

from pathlib import Path

import pytest
import torch

from shared.attention.native_decode import PATH_ENV_VAR, PATH_NAMES, load_native_decode
from shared.errors import ConfigurationError
from shared.kv_cache.blocks import blocks_for_tokens

SPARE_BLOCKS = 40


@pytest.fixture(scope="module")
def kernel():
    kernel = load_native_decode()
    assert kernel is not None, "the C++ decode kernel must build on this machine (needs g++)"
    return kernel


def paged_inputs(context_lens, num_heads, num_kv_heads, head_dim, block_size, dtype, seed=0):
    generator = torch.Generator().manual_seed(seed)
    max_blocks = max(blocks_for_tokens(length, block_size) for length in context_lens)
    num_blocks = len(context_lens) * max_blocks + SPARE_BLOCKS
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    key_cache = torch.randn(shape, generator=generator).to(dtype)
    value_cache = torch.randn(shape, generator=generator).to(dtype)
    free_blocks = torch.randperm(num_blocks, generator=generator)
    block_tables = free_blocks[:len(context_lens) * max_blocks].view(len(context_lens), max_blocks)
    query = torch.randn(len(context_lens), num_heads, head_dim, generator=generator).to(dtype)
    return query, key_cache, value_cache, block_tables.to(torch.int32), torch.tensor(context_lens, dtype=torch.int32)


def reference_decode(query, key_cache, value_cache, block_tables, context_lens):
    """softmax(q k^T / sqrt(d)) v per sequence in float64, over its context gathered by block."""
    num_heads, head_dim = query.shape[1:]
    queries_per_kv = num_heads // key_cache.shape[2]
    outputs = []
    for row, context_len in enumerate(context_lens.tolist()):
        keys = key_cache[block_tables[row].long()].flatten(0, 1)[:context_len].double()
        values = value_cache[block_tables[row].long()].flatten(0, 1)[:context_len].double()
        keys = keys.repeat_interleave(queries_per_kv, dim=1)
        values = values.repeat_interleave(queries_per_kv, dim=1)
        scores = torch.einsum("hd,khd->hk", query[row].double(), keys) / head_dim ** 0.5
        outputs.append(torch.einsum("hk,khd->hd", scores.softmax(dim=-1), values))
    return torch.stack(outputs)


SHAPES = {
    "smollm2": (9, 3, 64, 16),
    "head-dim-32": (4, 2, 32, 16),
    "head-dim-128-mha": (2, 2, 128, 16),
    "8-per-kv-head": (8, 1, 64, 16),
    "blocks-of-8": (9, 3, 64, 8),
    "blocks-of-32": (9, 3, 64, 32),
    "head-dim-16": (4, 2, 16, 4),
    "head-dim-48": (6, 2, 48, 16),
    "16-per-kv-head": (16, 1, 64, 16),
    "blocks-of-1": (9, 3, 64, 1),
    "blocks-of-5": (9, 3, 64, 5),
    "blocks-of-64": (9, 3, 64, 64),
    "portable-head-dim-8": (4, 2, 8, 4),
    "portable-head-dim-40": (6, 3, 40, 16),
}
CONTEXT_LENS = [1, 15, 16, 17, 33, 70, 5]


def require_path(kernel, path, num_heads, num_kv_heads, head_dim, block_size, dtype):
    if path not in kernel.available_paths(num_heads, num_kv_heads, head_dim, block_size, dtype):
        pytest.skip(f"the {path} path does not run these shapes on this machine")


@pytest.mark.parametrize("path", PATH_NAMES)
@pytest.mark.parametrize("shape", list(SHAPES.values()), ids=list(SHAPES))
@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, 1e-5), (torch.bfloat16, 1.5e-2)],
                         ids=["float32", "bfloat16"])
def test_kernel_matches_float64_reference(kernel, shape, dtype, tolerance, path):
    num_heads, num_kv_heads, head_dim, block_size = shape
    assert kernel.supports(num_heads, num_kv_heads, head_dim, block_size, dtype)
    require_path(kernel, path, num_heads, num_kv_heads, head_dim, block_size, dtype)
    inputs = paged_inputs(CONTEXT_LENS, num_heads, num_kv_heads, head_dim, block_size, dtype)
    output = kernel(*inputs, scale=head_dim ** -0.5, path=path)
    assert output.shape == (len(CONTEXT_LENS), num_heads, head_dim) and output.dtype == dtype
    # bf16: the reference sees the same rounded inputs; the kernel rounds probabilities and the
    # output to bf16's 8 significant bits.
    torch.testing.assert_close(output.double(), reference_decode(*inputs), rtol=0, atol=tolerance)


@pytest.mark.parametrize("path", PATH_NAMES)
def test_kernel_never_reads_past_a_context(kernel, path):
    """NaN in every slot past the context (same blocks) must not reach the output."""
    require_path(kernel, path, 9, 3, 64, 16, torch.bfloat16)
    query, key_cache, value_cache, block_tables, context_lens = paged_inputs([17, 5], 9, 3, 64, 16, torch.bfloat16)
    expected = reference_decode(query, key_cache, value_cache, block_tables, context_lens)
    for row, context_len in enumerate(context_lens.tolist()):
        last_block = block_tables[row, (context_len - 1) // 16].item()
        key_cache[last_block, context_len % 16:] = float("nan")
        value_cache[last_block, context_len % 16:] = float("nan")
    output = kernel(query, key_cache, value_cache, block_tables, context_lens, scale=64 ** -0.5, path=path)
    torch.testing.assert_close(output.double(), expected, rtol=0, atol=1.5e-2)


def test_kernel_refuses_shapes_beyond_its_limits(kernel):
    assert not kernel.supports(9, 3, 512, 16, torch.bfloat16)       # head dim
    assert not kernel.supports(64, 1, 64, 16, torch.bfloat16)       # query heads per KV head
    assert not kernel.supports(9, 3, 64, 128, torch.bfloat16)       # block size
    assert not kernel.supports(9, 3, 64, 16, torch.float16)         # dtype


def cpu_has(flag: str) -> bool:
    cpuinfo = Path("/proc/cpuinfo")
    return cpuinfo.exists() and any(line.startswith("flags") and flag in line.split()
                                    for line in cpuinfo.read_text().splitlines())


def paths_for(kernel, head_dim, dtype, num_heads=9, num_kv_heads=3, block_size=16):
    return kernel.available_paths(num_heads, num_kv_heads, head_dim, block_size, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_head_dims_off_the_16_lane_grid_have_only_the_portable_path(kernel, dtype):
    for head_dim in (8, 24, 40, 72):
        assert paths_for(kernel, head_dim, dtype, num_heads=2, num_kv_heads=1) == ["portable"]


@pytest.mark.skipif(not cpu_has("avx512f"), reason="this CPU has no AVX-512F")
def test_avx512_cpus_have_their_vector_paths(kernel):
    assert paths_for(kernel, 64, torch.float32) == ["portable", "avx512f"]
    assert paths_for(kernel, 48, torch.bfloat16) == ["portable", "avx512f"]
    expected = ["portable", "avx512f"] + ["avx512-bf16"] * cpu_has("avx512_bf16") + ["amx"] * cpu_has("amx_bf16")
    assert paths_for(kernel, 64, torch.bfloat16) == expected
    # AMX tiles are 16 key rows of one block; other blocks keep the vector paths.
    assert "amx" not in paths_for(kernel, 64, torch.bfloat16, block_size=8)


def test_rows_take_the_fastest_path_unless_one_is_forced(kernel, monkeypatch):
    fastest = paths_for(kernel, 64, torch.bfloat16)[-1]
    assert kernel.path(9, 3, 64, 16, torch.bfloat16) == fastest
    monkeypatch.setenv(PATH_ENV_VAR, "portable")
    assert kernel.path(9, 3, 64, 16, torch.bfloat16) == "portable"
    monkeypatch.setenv(PATH_ENV_VAR, "auto")
    assert kernel.path(9, 3, 64, 16, torch.bfloat16) == fastest


def test_a_forced_path_that_cannot_run_is_a_configuration_error(kernel, monkeypatch):
    monkeypatch.setenv(PATH_ENV_VAR, "fastest")
    with pytest.raises(ConfigurationError, match=PATH_ENV_VAR):
        kernel.path(9, 3, 64, 16, torch.bfloat16)
    monkeypatch.setenv(PATH_ENV_VAR, "avx512f")
    with pytest.raises(ConfigurationError, match="head_dim=40"):
        kernel.path(6, 3, 40, 16, torch.bfloat16)
