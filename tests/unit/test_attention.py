"""The CPU paged-attention backend against a float64 reference on contiguous keys/values.

One mixed step holds three decodes with different context lengths, a fresh prompt and a chunk
of a longer prompt whose first tokens are already cached; every sequence's blocks are
non-contiguous and shuffled, and the cache around them is full of unrelated data.
"""

import pytest
import torch

from shared.attention import torch_paged_step
from shared.attention.torch_paged import TorchPagedAttention
from shared.attention.torch_paged_step import split_by_length
from shared.kv_cache.blocks import blocks_for_tokens
from tests.unit.paged_batch import StepSequence, build_batch, slot_of

BLOCK_SIZE = 4
NUM_BLOCKS = 32
HEAD_DIM = 8
# (context_len, query_len, spare blocks beyond the context, as the scheduler may hand out).
DECODES = [(1, 1, 0), (6, 1, 1), (13, 1, 0)]
PREFILLS = [
    (9, 9, 0),   # a fresh prompt
    (22, 5, 1),  # a chunk of a longer prompt: 17 tokens already cached
]


class Step:
    """A step over the given sequences, each with shuffled blocks, full float64 keys/values
    and queries, on a cache whose every slot holds random data before the step."""

    def __init__(self, num_heads: int, num_kv_heads: int, dtype: torch.dtype,
                 decodes=DECODES, prefills=PREFILLS):
        generator = torch.Generator().manual_seed(0)
        free_blocks = torch.randperm(NUM_BLOCKS, generator=generator).tolist()
        self.sequences = []
        for context_len, query_len, spare_blocks in decodes + prefills:
            num_blocks = blocks_for_tokens(context_len, BLOCK_SIZE) + spare_blocks
            block_ids = [free_blocks.pop() for _ in range(num_blocks)]
            self.sequences.append(StepSequence(block_ids, context_len, query_len))
        self.batch = build_batch(self.sequences[:len(decodes)], self.sequences[len(decodes):], BLOCK_SIZE)
        self.keys = [torch.randn(s.context_len, num_kv_heads, HEAD_DIM, generator=generator, dtype=torch.float64)
                     for s in self.sequences]
        self.values = [torch.randn(s.context_len, num_kv_heads, HEAD_DIM, generator=generator, dtype=torch.float64)
                       for s in self.sequences]
        self.queries = [torch.randn(s.query_len, num_heads, HEAD_DIM, generator=generator, dtype=torch.float64)
                        for s in self.sequences]
        shape = (NUM_BLOCKS, BLOCK_SIZE, num_kv_heads, HEAD_DIM)
        self.key_cache = torch.randn(shape, generator=generator).to(dtype)
        self.value_cache = torch.randn(shape, generator=generator).to(dtype)
        self._store_earlier_tokens()

    def _store_earlier_tokens(self) -> None:
        for seq, keys, values in zip(self.sequences, self.keys, self.values):
            for position in range(seq.context_len - seq.query_len):
                block, offset = divmod(slot_of(seq.block_ids, position, BLOCK_SIZE), BLOCK_SIZE)
                self.key_cache[block, offset] = keys[position]
                self.value_cache[block, offset] = values[position]

    def new_rows(self, tensors: list[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
        """The step's new tokens' rows of per-sequence tensors, flattened in batch order."""
        return torch.cat([t[-seq.query_len:] for seq, t in zip(self.sequences, tensors)]).to(dtype)

    def run(self, backend: TorchPagedAttention, dtype: torch.dtype) -> torch.Tensor:
        step = backend.prepare(self.batch.metadata, BLOCK_SIZE, dtype)
        return backend.forward(self.new_rows(self.queries, dtype), self.new_rows(self.keys, dtype),
                               self.new_rows(self.values, dtype), self.key_cache, self.value_cache, step)


def reference_attention(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """softmax(q k^T / sqrt(d)) v in float64; query row i is context position len(keys) - len(query) + i
    and sees positions up to its own. Query head h reads KV head h // (heads per KV head)."""
    queries_per_kv = query.shape[1] // keys.shape[1]
    keys = keys.repeat_interleave(queries_per_kv, dim=1)
    values = values.repeat_interleave(queries_per_kv, dim=1)
    scores = torch.einsum("qhd,khd->hqk", query, keys) / HEAD_DIM ** 0.5
    first_position = len(keys) - len(query)
    is_future = torch.arange(len(keys))[None, :] > torch.arange(first_position, len(keys))[:, None]
    weights = scores.masked_fill(is_future, float("-inf")).softmax(dim=-1)
    return torch.einsum("hqk,khd->qhd", weights, values)


def expected_output(step: Step, input_dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """The reference on the step's inputs as rounded to `input_dtype`."""
    def rounded(tensor: torch.Tensor) -> torch.Tensor:
        return tensor.to(input_dtype).double()
    return torch.cat([reference_attention(rounded(q), rounded(k), rounded(v))
                      for q, k, v in zip(step.queries, step.keys, step.values)])


# The three decode paths: the C++ kernel, and torch's flat and per-KV-head-grouped matmuls.
DECODE_PATHS = {
    "native-decode": {"decode_kernel": "native"},
    "flat-decode": {"decode_kernel": "torch", "flat_decode": True},
    "grouped-decode": {"decode_kernel": "torch", "flat_decode": False},
}
decode_paths = pytest.mark.parametrize("decode_path", list(DECODE_PATHS.values()), ids=list(DECODE_PATHS))


@decode_paths
@pytest.mark.parametrize("num_heads, num_kv_heads", [(4, 2), (4, 1), (4, 4)])
def test_mixed_step_matches_float64_reference_in_float32(num_heads, num_kv_heads, decode_path):
    step = Step(num_heads, num_kv_heads, torch.float32)
    backend = TorchPagedAttention(num_heads, num_kv_heads, HEAD_DIM, **decode_path)
    output = step.run(backend, torch.float32)
    assert output.shape == (3 + 9 + 5, num_heads, HEAD_DIM)
    assert output.dtype == torch.float32
    torch.testing.assert_close(output.double(), expected_output(step), rtol=0, atol=1e-5)


@decode_paths
def test_mixed_step_matches_float64_reference_in_bfloat16(decode_path):
    step = Step(4, 2, torch.bfloat16)
    backend = TorchPagedAttention(4, 2, HEAD_DIM, **decode_path)
    output = step.run(backend, torch.bfloat16)
    assert output.dtype == torch.bfloat16
    # The reference sees the same bf16-rounded inputs; what is left is the rounding of scores,
    # probabilities and outputs to bf16's 8 significant bits: about one unit in the last place.
    torch.testing.assert_close(output.double(), expected_output(step, torch.bfloat16), rtol=0, atol=1e-2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_new_tokens_land_in_their_slots_and_nothing_else_changes(dtype):
    step = Step(4, 2, dtype)
    keys_before, values_before = step.key_cache.clone(), step.value_cache.clone()
    step.run(TorchPagedAttention(4, 2, HEAD_DIM), dtype)
    slots = step.batch.metadata.slot_mapping
    flat_keys = step.key_cache.view(-1, 2, HEAD_DIM)
    flat_values = step.value_cache.view(-1, 2, HEAD_DIM)
    assert torch.equal(flat_keys[slots], step.new_rows(step.keys, dtype))
    assert torch.equal(flat_values[slots], step.new_rows(step.values, dtype))
    untouched = torch.ones(NUM_BLOCKS * BLOCK_SIZE, dtype=torch.bool)
    untouched[slots] = False
    assert torch.equal(flat_keys[untouched], keys_before.view(-1, 2, HEAD_DIM)[untouched])
    assert torch.equal(flat_values[untouched], values_before.view(-1, 2, HEAD_DIM)[untouched])
    assert int(untouched.sum()) == NUM_BLOCKS * BLOCK_SIZE - (3 + 9 + 5)


@decode_paths
@pytest.mark.parametrize("decodes, prefills", [(DECODES, []), ([], PREFILLS)], ids=["decodes", "prefills"])
def test_decodes_alone_and_prefills_alone_match_the_reference(decodes, prefills, decode_path):
    step = Step(4, 2, torch.float32, decodes, prefills)
    output = step.run(TorchPagedAttention(4, 2, HEAD_DIM, **decode_path), torch.float32)
    torch.testing.assert_close(output.double(), expected_output(step), rtol=0, atol=1e-5)


@pytest.mark.parametrize("flat_decode", [True, False], ids=["flat-decode", "grouped-decode"])
def test_decodes_split_into_length_groups_match_the_reference(monkeypatch, flat_decode):
    monkeypatch.setattr(torch_paged_step, "GROUP_OVERHEAD_KEY_POSITIONS", 0)
    decodes = [(13, 1, 0), (1, 1, 0), (6, 1, 1), (2, 1, 0), (11, 1, 0)]
    step = Step(4, 2, torch.float32, decodes, PREFILLS)
    backend = TorchPagedAttention(4, 2, HEAD_DIM, flat_decode=flat_decode, decode_kernel="torch")
    groups = backend.prepare(step.batch.metadata, BLOCK_SIZE, torch.float32).decode_groups
    assert [group.rows.tolist() for group in groups] == [[1, 3], [2], [4, 0]]
    output = step.run(backend, torch.float32)
    torch.testing.assert_close(output.double(), expected_output(step), rtol=0, atol=1e-5)


@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)], ids=["fp32", "bf16"])
def test_prefill_chunks_match_the_reference_with_and_without_cached_tokens(dtype, tolerance):
    """A chunk that starts its sequence runs plainly causal (no mask built); one after cached
    tokens (earlier chunks or prefix hits) takes the offset causal mask."""
    step = Step(6, 2, dtype, [], PREFILLS)
    backend = TorchPagedAttention(6, 2, HEAD_DIM)
    chunks = backend.prepare(step.batch.metadata, BLOCK_SIZE, dtype).prefills
    assert [chunk.score_bias is None for chunk in chunks] == [chunk.context_len == chunk.query_len for chunk in chunks]
    assert any(chunk.score_bias is None for chunk in chunks) and any(chunk.score_bias is not None for chunk in chunks)
    output = step.run(backend, dtype)
    torch.testing.assert_close(output.double(), expected_output(step, dtype), rtol=0, atol=tolerance)


def test_length_groups_pay_for_their_overhead():
    assert split_by_length([5, 5, 5, 5], block_size=16) == [[0, 1, 2, 3]]
    # 64 decodes, half at 100 tokens and half at 400: two groups save 64 * 400 - (32 * 112 + 32 * 400)
    # padded key positions, far more than one group's overhead.
    lengths = [100, 400] * 32
    assert split_by_length(lengths, block_size=16) == [list(range(0, 64, 2)), list(range(1, 64, 2))]
    # Two short decodes: splitting saves 16 positions, not worth a group.
    assert split_by_length([3, 20], block_size=16) == [[0, 1]]


def test_native_decode_is_the_default_where_it_builds():
    assert TorchPagedAttention(9, 3, 64).native_decode is not None
    assert TorchPagedAttention(9, 3, 64, decode_kernel="torch").native_decode is None
    with pytest.raises(ValueError, match="decode_kernel: expected auto, native or torch, got 'cuda'"):
        TorchPagedAttention(9, 3, 64, decode_kernel="cuda")


def test_flat_decode_is_the_default_only_for_few_kv_heads():
    assert TorchPagedAttention(9, 3, 64).flat_decode is True
    assert TorchPagedAttention(32, 8, 128).flat_decode is False


def test_the_kv_store_writes_strided_rows_at_their_slots_and_refuses_slots_outside_the_cache():
    from shared.attention.native_decode import load_native_decode
    from shared.attention.torch_paged import _store
    from shared.attention.torch_paged_step import TorchPagedStep

    qkv = torch.randn(5, 3 * 2 * HEAD_DIM)  # tokens' keys and values inside wider rows, as the model has them
    key, value = qkv[:, :2 * HEAD_DIM].view(5, 2, HEAD_DIM), qkv[:, 2 * HEAD_DIM:4 * HEAD_DIM].view(5, 2, HEAD_DIM)
    slots = torch.tensor([7, 0, 12, 3, 9])
    caches = torch.zeros(2, 4, BLOCK_SIZE, 2, HEAD_DIM)
    _store(key, value, caches[0], caches[1], TorchPagedStep(slots, 0, [], []), load_native_decode())
    assert torch.equal(caches[0].view(-1, 2, HEAD_DIM)[slots], key)
    assert torch.equal(caches[1].view(-1, 2, HEAD_DIM)[slots], value)
    outside = TorchPagedStep(torch.tensor([1, 2, 3, 4, 4 * BLOCK_SIZE]), 0, [], [])
    with pytest.raises((IndexError, RuntimeError)):
        _store(key, value, caches[0], caches[1], outside, load_native_decode())
