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
    Returns the stage's output activations (T, hidden_size), or (R, vocab) logits in the model's dtype."""
    if hidden is None:
        hidden = model.embed_tokens(input_ids)
    hidden, residual = model.forward_layers(hidden, positions, kv_cache, attn_metadata)
    if logits_indices is not None:
        return model.logits(hidden, residual, logits_indices)
    return hidden if residual is None else residual.add_(hidden)  # what the next stage's layers take
