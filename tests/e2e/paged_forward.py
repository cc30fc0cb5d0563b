"""Run a loaded model on one prompt through the paged KV cache, returning every row's logits."""

import torch

from shared.attention.metadata import AttentionMetadata
from shared.kv_cache.blocks import blocks_for_tokens
from shared.kv_cache.layout import KVCacheLayout


def prompt_logits(model, config, prompt: list[int], block_size: int) -> torch.Tensor:
    num_blocks = blocks_for_tokens(len(prompt), block_size)
    dtype = next(model.parameters()).dtype
    layout = KVCacheLayout(config.num_layers, num_blocks, block_size, config.num_kv_heads, config.head_dim, dtype)
    kv_cache = layout.allocate()
    positions = torch.arange(len(prompt))
    block_table = torch.arange(num_blocks)
    metadata = AttentionMetadata(
        slot_mapping=positions.clone(), num_decode_tokens=0,
        decode_block_tables=torch.zeros(0, 0, dtype=torch.long), decode_context_lens=torch.zeros(0, dtype=torch.long),
        prefill_query_lens=[len(prompt)], prefill_context_lens=[len(prompt)], prefill_block_tables=[block_table])
    with torch.inference_mode():
        return model(torch.tensor(prompt), positions, kv_cache, metadata, positions.clone()).float()
