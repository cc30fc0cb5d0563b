"""Layers that talk across tensor-parallel ranks, swapped into a loaded model shard.

`AllReduceOutput` wraps a row-parallel projection (o_proj, down_proj): each rank multiplies its
slice of the input features, the ranks' partial outputs are summed. `VocabParallelEmbedding`
looks up the ids in this rank's vocabulary slice (zero rows elsewhere) and sums over ranks.
`VocabParallelLMHead` computes this rank's logits columns and gathers the full vocabulary.
"""

import torch
import torch.nn.functional as F
from torch import nn

from shared.parallel.groups import ParallelGroups


class AllReduceOutput(nn.Module):
    def __init__(self, projection: nn.Module, groups: ParallelGroups):
        super().__init__()
        self.projection = projection
        self.groups = groups

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.groups.all_reduce(self.projection(x))


class VocabParallelEmbedding(nn.Module):
    def __init__(self, embedding: nn.Embedding, groups: ParallelGroups):
        super().__init__()
        self.weight = embedding.weight
        self.groups = groups
        self.first_id = groups.tensor_rank * embedding.weight.shape[0]

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        local_ids = input_ids - self.first_id
        outside = (local_ids < 0) | (local_ids >= self.weight.shape[0])
        hidden = F.embedding(local_ids.masked_fill(outside, 0), self.weight)
        hidden.masked_fill_(outside.unsqueeze(-1), 0)
        return self.groups.all_reduce(hidden)


class VocabParallelLMHead(nn.Module):
    def __init__(self, lm_head: nn.Module, groups: ParallelGroups, vocab_size: int):
        super().__init__()
        self.lm_head = lm_head
        self.groups = groups
        self.vocab_size = vocab_size

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.groups.all_gather_last_dim(self.lm_head(hidden))
        return logits[..., :self.vocab_size]


def make_tensor_parallel(model: nn.Module, groups: ParallelGroups, vocab_size: int) -> None:
    """Swap a loaded shard's layers for their communicating versions (after weight packing)."""
    if groups.tensor_parallel_size == 1:
        return
    for layer in model.layers:
        layer.self_attn.o_proj = AllReduceOutput(layer.self_attn.o_proj, groups)
        layer.mlp.down_proj = AllReduceOutput(layer.mlp.down_proj, groups)
    model.embed_tokens = VocabParallelEmbedding(model.embed_tokens, groups)
    model.lm_head = VocabParallelLMHead(model.lm_head, groups, vocab_size)
