"""The Llama network in plain torch, run on a flat batch of tokens from many sequences.

The model runner calls `LlamaForCausalLM.forward` once per engine step with every scheduled
token (decodes first, then prefill chunks; no padding) and the paged KV cache. Queries, keys
and values come out of one fused `qkv_proj` matmul and the MLP's gate and up projections out of
one `gate_up_proj` matmul; `shared/model/loader.py` fuses HF checkpoints into that shape.

Each layer hands the next its MLP output and the residual stream before it, and the next
layer's input RMSNorm adds the two (as vLLM's fused add-RMSNorm), so no layer spends a pass on
the residual add; a pipeline stage that ends mid-model adds them before sending. The RMSNorms
and the rotary embedding run as Triton kernels with an attention backend that asks for
`fused_layer_ops` (CUDA), as one C++ pass each on the CPU, else in torch (layer_ops.py).
"""

import torch
import torch.nn.functional as F
from torch import nn

from shared.attention.backend import AttentionBackend
from shared.attention.metadata import AttentionMetadata
from shared.attention.torch_paged import TorchPagedAttention
from shared.model.config import ModelConfig
from shared.model.layer_ops import LayerOps, TorchLayerOps, select_layer_ops
from shared.model.rotary import RotaryEmbedding, RotaryTables


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps
        self.ops: LayerOps = TorchLayerOps()  # set by LlamaForCausalLM

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        """Normalize x; with `residual`, first `residual += x` (in place) and normalize that."""
        return self.ops.rms_norm(x, self.weight, self.eps, residual)


class LlamaAttention(nn.Module):
    def __init__(self, config: ModelConfig, backend: AttentionBackend):
        super().__init__()
        self.num_heads = config.num_heads
        self.num_kv_heads = config.num_kv_heads
        self.head_dim = config.head_dim
        qkv_size = (config.num_heads + 2 * config.num_kv_heads) * config.head_dim
        self.qkv_proj = nn.Linear(config.hidden_size, qkv_size, bias=config.attention_bias)
        self.o_proj = nn.Linear(config.num_heads * config.head_dim, config.hidden_size, bias=config.attention_bias)
        self.backend = backend
        self.ops: LayerOps = TorchLayerOps()  # set by LlamaForCausalLM

    def forward(self, hidden: torch.Tensor, rotary: RotaryTables, key_cache: torch.Tensor,
                value_cache: torch.Tensor, step: object) -> torch.Tensor:
        num_tokens = hidden.shape[0]
        num_rotated_heads = self.num_heads + self.num_kv_heads
        qkv = self.qkv_proj(hidden)
        query_and_key = qkv[:, :num_rotated_heads * self.head_dim].view(num_tokens, num_rotated_heads, self.head_dim)
        rotated = self.ops.rotate(query_and_key, rotary)
        query, key = rotated.split([self.num_heads, self.num_kv_heads], dim=1)
        value = qkv[:, num_rotated_heads * self.head_dim:].view(num_tokens, self.num_kv_heads, self.head_dim)
        attended = self.backend.forward(query, key, value, key_cache, value_cache, step)
        return self.o_proj(attended.reshape(num_tokens, self.num_heads * self.head_dim))


class LlamaMLP(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.gate_up_proj = nn.Linear(config.hidden_size, 2 * config.intermediate_size, bias=config.mlp_bias)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=config.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, backend: AttentionBackend):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = LlamaAttention(config, backend)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = LlamaMLP(config)

    def forward(self, hidden: torch.Tensor, residual: torch.Tensor | None, rotary: RotaryTables,
                key_cache: torch.Tensor, value_cache: torch.Tensor,
                step: object) -> tuple[torch.Tensor, torch.Tensor]:
        """`hidden`: the previous layer's MLP output, or the layer's whole input when `residual`
        is None; `residual`: the stream before that output. Returns this layer's MLP output and
        the stream before it (both updated in place where they came in)."""
        if residual is None:
            residual, normed = hidden, self.input_layernorm(hidden)
        else:
            normed = self.input_layernorm(hidden, residual=residual)  # residual += hidden
        attended = self.self_attn(normed, rotary, key_cache, value_cache, step)
        normed = self.post_attention_layernorm(attended, residual=residual)  # residual += attended
        return self.mlp(normed), residual


class LlamaForCausalLM(nn.Module):
    """Built by `load_model`; the attention backend defaults to the CPU one."""

    def __init__(self, config: ModelConfig, attn_backend: AttentionBackend | None = None):
        super().__init__()
        self.config = config
        self.attn_backend = attn_backend or TorchPagedAttention(
            config.num_heads, config.num_kv_heads, config.head_dim)
        # Weights come from the checkpoint (the model is built on the meta device): no random
        # init. Embedding's would call normal_, whose meta path imports torch._dynamo, 1.5 s of
        # every engine process's start.
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size,
                                         _weight=torch.empty(config.vocab_size, config.hidden_size))
        self.layers = nn.ModuleList(LlamaDecoderLayer(config, self.attn_backend) for _ in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.rotary = RotaryEmbedding(config.head_dim, config.max_position_embeddings, config.rope_theta)
        self.tie_weights()
        ops = select_layer_ops(self.attn_backend, config.head_dim)
        for module in self.modules():
            if isinstance(module, (RMSNorm, LlamaAttention)):
                module.ops = ops

    def tie_weights(self) -> None:
        """With tied embeddings the LM head reads the embedding matrix (call after loading)."""
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_cache: torch.Tensor,
                attn_metadata: AttentionMetadata, logits_indices: torch.Tensor) -> torch.Tensor:
        """input_ids, positions: (T,) int64; kv_cache: (2, num_layers, num_blocks, block_size,
        num_kv_heads, head_dim); logits_indices: (R,) rows whose logits are wanted.
        Returns (R, vocab_size) logits in the model's dtype (see `logits`)."""
        hidden = self.embed_tokens(input_ids)
        return self.logits(*self.forward_layers(hidden, positions, kv_cache, attn_metadata), logits_indices)

    def forward_layers(self, hidden: torch.Tensor, positions: torch.Tensor, kv_cache: torch.Tensor,
                       attn_metadata: AttentionMetadata) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Every layer over `hidden` (T, hidden_size); returns the last MLP output and the
        residual stream before it (None without layers): their sum is the layers' output."""
        rotary = self.rotary.lookup(positions, hidden.dtype)
        step = self.attn_backend.prepare(attn_metadata, kv_cache.shape[3], hidden.dtype)
        residual = None
        for layer, key_cache, value_cache in zip(self.layers, kv_cache[0].unbind(0), kv_cache[1].unbind(0)):
            hidden, residual = layer(hidden, residual, rotary, key_cache, value_cache, step)
        return hidden, residual

    def logits(self, hidden: torch.Tensor, residual: torch.Tensor | None,
               logits_indices: torch.Tensor) -> torch.Tensor:
        """(R, vocab_size) logits of the rows `logits_indices` of the layers' output, in the model's
        dtype, as transformers computes them: a bf16 model's logits are bf16 values. Consumers
        widen them to fp32 where they compute with them (penalties, softmax, logprobs); an
        all-greedy step takes its argmax on them as they are (the same token: widening is exact)."""
        rows = hidden.index_select(0, logits_indices)
        rows_residual = None if residual is None else residual.index_select(0, logits_indices)
        return self.lm_head(self.norm(rows, residual=rows_residual))
