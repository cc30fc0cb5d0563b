"""One pipeline stage's share of `LlamaForCausalLM.forward`.

The first stage embeds the token ids, the others start from the activations the previous stage
sent; every stage runs its own layers over its own KV cache (its layers only); the last stage
applies the final norm and LM head to the rows whose logits are wanted. With one stage this is
exactly the model's forward pass.
"""

import torch

from shared.attention.metadata import AttentionMetadata
from shared.model.llama import LlamaForCausalLM


def forward_stage(model: LlamaForCausalLM, input_ids: torch.Tensor, positions: torch.Tensor,
                  hidden: torch.Tensor | None, kv_cache: torch.Tensor, attn_metadata: AttentionMetadata,
                  logits_indices: torch.Tensor | None) -> torch.Tensor:
    """`hidden` is None on the first stage; `logits_indices` None on every stage but the last.
    Returns the stage's output activations (T, hidden_size), or (R, vocab) float32 logits."""
    if hidden is None:
        hidden = model.embed_tokens(input_ids)
    rotary = model.rotary.lookup(positions, hidden.dtype)
    step = model.attn_backend.prepare(attn_metadata, kv_cache.shape[3], hidden.dtype)
    for layer, key_cache, value_cache in zip(model.layers, kv_cache[0].unbind(0), kv_cache[1].unbind(0)):
        hidden = layer(hidden, rotary, key_cache, value_cache, step)
    if logits_indices is None:
        return hidden
    return model.lm_head(model.norm(hidden.index_select(0, logits_indices))).float()
