"""The C++ kernel's segments: a prompt chunk's rows passed together give each row the very
bits it gets as a decode row alone, on every path, and match a float64 reference.

Deterministic mode (docs/deterministic.md) relies on this: a token's attention output must not
depend on how its sequence's prompt was cut into chunks or what else shared the call.
"""

import random

import pytest
import torch

from tests.unit.test_native_decode import kernel, paged_inputs, reference_decode  # noqa: F401 (fixture)

# (num_heads, num_kv_heads, head_dim, block_size): SmolLM2, then odd shapes on each path.
SHAPES = {
    "smollm2": (9, 3, 64, 16),
    "head-dim-48-blocks-of-5": (6, 2, 48, 5),
    "16-per-kv-head-blocks-of-64": (16, 1, 32, 64),
    "blocks-of-1": (4, 2, 16, 1),
    "portable-head-dim-24": (6, 3, 24, 8),
}
# The chunked sequence's length: more rows than one work item of the AVX-512F path takes (16).
SEQUENCE_LEN = 83
DTYPES = {"float32": (torch.float32, 1e-5), "bfloat16": (torch.bfloat16, 1.5e-2)}


def random_chunks(length: int, rng: random.Random) -> list[int]:
    """Chunk lengths summing to `length`: random cuts, sometimes 1-row chunks, sometimes one chunk."""
    cuts = sorted(rng.sample(range(1, length), rng.randint(0, 6)))
    return [end - start for start, end in zip([0, *cuts], [*cuts, length])]


def one_row_each(query, key_cache, value_cache, table, kernel, scale):
    """Every position of the sequence as a decode row of its own, one call."""
    length = query.shape[0]
    tables = table.expand(length, -1).contiguous()
    context_lens = torch.arange(1, length + 1, dtype=torch.int32)
    return kernel(query, key_cache, value_cache, tables, context_lens, scale)


def as_segments(query, key_cache, value_cache, table, kernel, scale, chunks, decode_inputs):
    """Decode rows of other sequences first, then the sequence in `chunks`, one call."""
    decode_query, decode_tables, decode_lens = decode_inputs
    width = max(table.shape[1], decode_tables.shape[1])
    tables = torch.zeros((len(decode_lens) + len(chunks), width), dtype=torch.int32)
    tables[:len(decode_lens), :decode_tables.shape[1]] = decode_tables
    tables[len(decode_lens):, :table.shape[1]] = table
    ends = torch.tensor(chunks).cumsum(0)
    context_lens = torch.cat([decode_lens, ends.to(torch.int32)])
    query_lens = torch.tensor([1] * len(decode_lens) + chunks, dtype=torch.int32)
    output = kernel(torch.cat([decode_query, query]), key_cache, value_cache, tables, context_lens, scale,
                    query_lens)
    return output[:len(decode_lens)], output[len(decode_lens):]


@pytest.mark.parametrize("shape", list(SHAPES.values()), ids=list(SHAPES))
@pytest.mark.parametrize("dtype_name", list(DTYPES))
def test_chunk_rows_are_the_bits_of_rows_alone(kernel, shape, dtype_name):
    num_heads, num_kv_heads, head_dim, block_size = shape
    dtype, tolerance = DTYPES[dtype_name]
    scale = head_dim ** -0.5
    # One long sequence (row 0's table) and three other sequences decoding beside it.
    lens = [SEQUENCE_LEN, 1, 16, 37]
    query, key_cache, value_cache, tables, context_lens = paged_inputs(lens, num_heads, num_kv_heads, head_dim,
                                                                       block_size, dtype, seed=3)
    sequence_query = torch.randn(SEQUENCE_LEN, num_heads, head_dim, generator=torch.Generator().manual_seed(4))
    sequence_query = sequence_query.to(dtype)
    table = tables[:1]
    alone = one_row_each(sequence_query, key_cache, value_cache, table, kernel, scale)
    decode_inputs = (query[1:], tables[1:].contiguous(), context_lens[1:])
    decodes_alone = kernel(*decode_inputs[:1], key_cache, value_cache, *decode_inputs[1:], scale)
    rng = random.Random(f"{shape}-{dtype_name}")
    for chunks in [[SEQUENCE_LEN]] + [random_chunks(SEQUENCE_LEN, rng) for _ in range(5)]:
        decodes, rows = as_segments(sequence_query, key_cache, value_cache, table, kernel, scale, chunks,
                                    decode_inputs)
        assert torch.equal(rows, alone), f"chunks {chunks}"
        assert torch.equal(decodes, decodes_alone), f"chunks {chunks}"
    expected = reference_decode(sequence_query, key_cache, value_cache, table.expand(SEQUENCE_LEN, -1),
                                torch.arange(1, SEQUENCE_LEN + 1))
    torch.testing.assert_close(alone.double(), expected, rtol=0, atol=tolerance)


def test_a_chunk_rereads_nothing_past_its_last_row(kernel):
    """NaN in the slots after the chunk's last position must not reach any row."""
    query, key_cache, value_cache, tables, _ = paged_inputs([40], 9, 3, 64, 16, torch.bfloat16)
    rows = torch.randn(20, 9, 64).to(torch.bfloat16)
    expected = reference_decode(rows, key_cache, value_cache, tables.expand(20, -1), torch.arange(21, 41))
    last_block = tables[0, 39 // 16].item()
    key_cache[last_block, 40 % 16:] = float("nan")
    value_cache[last_block, 40 % 16:] = float("nan")
    output = kernel(rows, key_cache, value_cache, tables, torch.tensor([40], dtype=torch.int32), 64 ** -0.5,
                    torch.tensor([20], dtype=torch.int32))
    torch.testing.assert_close(output.double(), expected, rtol=0, atol=1.5e-2)


def test_rows_and_segments_must_agree(kernel):
    query, key_cache, value_cache, tables, context_lens = paged_inputs([30], 9, 3, 64, 16, torch.bfloat16)
    with pytest.raises(ValueError, match="query_lens"):
        kernel(query, key_cache, value_cache, tables, context_lens, 0.125, torch.tensor([2], dtype=torch.int32))
