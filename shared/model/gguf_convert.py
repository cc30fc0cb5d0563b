"""Convert a llama-architecture GGUF file into a Hugging Face model folder.

`shared.model.default_model.resolve_model` calls `convert_gguf_to_hf` once per GGUF file
(under a file lock) and caches the result; everything downstream (model loader, tokenizer,
tests) then only ever reads plain HF folders: `config.json`, `generation_config.json`,
`model.safetensors` (float32) and the tokenizer files with the chat template.

The output folder is written to a temporary sibling folder and renamed into place, so a
crash never leaves a half-written folder. `CONVERSION_MARKER_FILE` records
`CONVERTER_VERSION`; bump it whenever the output changes so stale caches get rebuilt.
"""

from __future__ import annotations  # the gguf annotations need no gguf at import

import json
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import save_file

from shared.errors import ConfigurationError

logger = logging.getLogger(__name__)

CONVERTER_VERSION = 1
CONVERSION_MARKER_FILE = "pdserve_conversion.json"
WEIGHTS_FILE = "model.safetensors"

_MISSING = object()
_MKDTEMP_SUFFIX_LENGTH = 8  # tempfile.mkdtemp appends 8 random characters to the prefix

# llama.cpp per-layer tensor name (after "blk.N.") -> HF name (after "model.layers.N.").
_LAYER_TENSOR_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}

_GLOBAL_TENSOR_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}


@dataclass(frozen=True)
class LlamaHyperparams:
    """The model shape and special tokens, read from the GGUF metadata."""

    context_length: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float
    rms_norm_eps: float
    vocab_size: int
    bos_token_id: int | None
    eos_token_id: int | None
    pad_token_id: int | None
    chat_template: str | None


def _field_value(reader: gguf.GGUFReader, key: str, default: Any = _MISSING) -> Any:
    """One metadata value (scalar, string or list); `default` when absent, else an error."""
    field = reader.fields.get(key)
    if field is None:
        if default is _MISSING:
            raise ConfigurationError("model", f"GGUF metadata has no '{key}'")
        return default
    return field.contents()


def _as_float32_literal(value: float) -> float:
    """GGUF stores floats as float32; 9.99999974e-06 becomes the intended 1e-05."""
    return float(str(np.float32(value)))


def read_hyperparams(reader: gguf.GGUFReader) -> LlamaHyperparams:
    """Read every config field `build_config` needs; rejects non-llama GGUF files."""
    architecture = _field_value(reader, "general.architecture")
    if architecture != "llama":
        raise ConfigurationError("model", f"GGUF architecture '{architecture}' is not 'llama'")
    hidden_size = int(_field_value(reader, "llama.embedding_length"))
    num_heads = int(_field_value(reader, "llama.attention.head_count"))
    num_tokens = len(_field_value(reader, "tokenizer.ggml.tokens"))
    return LlamaHyperparams(
        context_length=int(_field_value(reader, "llama.context_length")),
        hidden_size=hidden_size,
        intermediate_size=int(_field_value(reader, "llama.feed_forward_length")),
        num_layers=int(_field_value(reader, "llama.block_count")),
        num_heads=num_heads,
        num_kv_heads=int(_field_value(reader, "llama.attention.head_count_kv", num_heads)),
        head_dim=int(_field_value(reader, "llama.rope.dimension_count", hidden_size // num_heads)),
        rope_theta=_as_float32_literal(_field_value(reader, "llama.rope.freq_base", 10000.0)),
        rms_norm_eps=_as_float32_literal(
            _field_value(reader, "llama.attention.layer_norm_rms_epsilon")
        ),
        vocab_size=int(_field_value(reader, "llama.vocab_size", num_tokens)),
        bos_token_id=_field_value(reader, "tokenizer.ggml.bos_token_id", None),
        eos_token_id=_field_value(reader, "tokenizer.ggml.eos_token_id", None),
        pad_token_id=_field_value(reader, "tokenizer.ggml.padding_token_id", None),
        chat_template=_field_value(reader, "tokenizer.chat_template", None),
    )


def hf_tensor_name(gguf_name: str) -> str:
    """`blk.3.attn_q.weight` -> `model.layers.3.self_attn.q_proj.weight`, and the globals."""
    if gguf_name in _GLOBAL_TENSOR_NAMES:
        return _GLOBAL_TENSOR_NAMES[gguf_name]
    parts = gguf_name.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[2] in _LAYER_TENSOR_NAMES:
        layer_index, kind, suffix = parts[1], parts[2], parts[3]
        return f"model.layers.{layer_index}.{_LAYER_TENSOR_NAMES[kind]}.{suffix}"
    raise ConfigurationError("model", f"unsupported GGUF tensor '{gguf_name}'")


def unpermute_rope_rows(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """Undo llama.cpp's Q/K row permutation so the weight suits HF's rotate-half RoPE.

    Within each head HF orders rows [first half | second half]; llama.cpp interleaves them
    (row 2*i + h of the head holds HF row h * head_dim/2 + i). Used on q_proj and k_proj.
    """
    num_rows = weight.shape[0]
    head_dim = num_rows // num_heads
    if num_rows % num_heads or head_dim % 2:
        raise ConfigurationError("model", f"{num_rows} rows do not split into {num_heads} heads")
    interleaved = weight.reshape(num_heads, head_dim // 2, 2, *weight.shape[1:])
    return np.ascontiguousarray(interleaved.swapaxes(1, 2).reshape(weight.shape))


def _hf_weight(tensor: Any, params: LlamaHyperparams) -> np.ndarray:
    """Dequantize one GGUF tensor to float32 in HF (out_features, in_features) order."""
    import gguf

    values = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
    hf_shape = tuple(int(size) for size in reversed(tensor.shape))
    values = np.asarray(values, dtype=np.float32).reshape(hf_shape)
    if ".attn_q." in tensor.name:
        return unpermute_rope_rows(values, params.num_heads)
    if ".attn_k." in tensor.name:
        return unpermute_rope_rows(values, params.num_kv_heads)
    return np.ascontiguousarray(values)


def read_hf_weights(reader: gguf.GGUFReader, params: LlamaHyperparams) -> dict[str, np.ndarray]:
    """All tensors of the GGUF, dequantized and renamed to HF Llama names."""
    return {hf_tensor_name(tensor.name): _hf_weight(tensor, params) for tensor in reader.tensors}


def build_config(params: LlamaHyperparams, is_tied: bool) -> dict[str, Any]:
    """The `config.json` of a LlamaForCausalLM with this shape."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_act": "silu",
        "hidden_size": params.hidden_size,
        "intermediate_size": params.intermediate_size,
        "num_hidden_layers": params.num_layers,
        "num_attention_heads": params.num_heads,
        "num_key_value_heads": params.num_kv_heads,
        "head_dim": params.head_dim,
        "max_position_embeddings": params.context_length,
        "rope_theta": params.rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": params.rope_theta},
        "rms_norm_eps": params.rms_norm_eps,
        "vocab_size": params.vocab_size,
        "bos_token_id": params.bos_token_id,
        "eos_token_id": params.eos_token_id,
        "pad_token_id": params.pad_token_id,
        "tie_word_embeddings": is_tied,
        "attention_bias": False,
        "mlp_bias": False,
        "torch_dtype": "float32",
    }


def build_generation_config(params: LlamaHyperparams) -> dict[str, Any]:
    """The `generation_config.json`: only the special token ids the GGUF knows."""
    return {
        "bos_token_id": params.bos_token_id,
        "eos_token_id": params.eos_token_id,
        "pad_token_id": params.pad_token_id,
    }


def _write_json(path: Path, content: dict[str, Any]) -> None:
    path.write_text(json.dumps(content, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def write_tokenizer(gguf_path: Path, params: LlamaHyperparams, out_dir: Path) -> None:
    """Save the GGUF's tokenizer as HF files, chat template inside `tokenizer_config.json`."""
    from transformers import AutoTokenizer  # slow import; only needed while converting

    tokenizer = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    if params.chat_template is not None:
        tokenizer.chat_template = params.chat_template
    tokenizer.model_max_length = params.context_length
    tokenizer.save_pretrained(str(out_dir), save_jinja_files=False)


def conversion_marker(gguf_path: Path) -> dict[str, Any]:
    """What `CONVERSION_MARKER_FILE` holds: converter version and the source file's identity."""
    source_stat = gguf_path.stat()
    return {
        "converter_version": CONVERTER_VERSION,
        "source_file_name": gguf_path.name,
        "source_size_bytes": source_stat.st_size,
        "source_mtime_ns": source_stat.st_mtime_ns,
    }


def is_current_conversion(folder: Path) -> bool:
    """True when `folder` is a finished conversion made by this `CONVERTER_VERSION`."""
    try:
        marker = json.loads((folder / CONVERSION_MARKER_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(marker, dict) and marker.get("converter_version") == CONVERTER_VERSION


def _write_model_folder(gguf_path: Path, out_dir: Path) -> None:
    """Write every output file into the (empty, private) folder `out_dir`; marker last."""
    import gguf  # only converting needs it: an HF folder loads without the package

    reader = gguf.GGUFReader(gguf_path)
    params = read_hyperparams(reader)
    weights = read_hf_weights(reader, params)
    is_tied = "lm_head.weight" not in weights
    save_file(weights, str(out_dir / WEIGHTS_FILE), metadata={"format": "pt"})
    del weights
    _write_json(out_dir / "config.json", build_config(params, is_tied))
    _write_json(out_dir / "generation_config.json", build_generation_config(params))
    write_tokenizer(gguf_path, params, out_dir)
    _write_json(out_dir / CONVERSION_MARKER_FILE, conversion_marker(gguf_path))


def _make_world_readable(folder: Path) -> None:
    """`mkdtemp` makes a private 0700 folder; a model cache folder should be 0755/0644."""
    folder.chmod(0o755)
    for file_path in folder.iterdir():
        file_path.chmod(0o644)


def _move_into_place(staging_dir: Path, out_dir: Path) -> None:
    """Rename `staging_dir` to `out_dir`, first moving aside any old folder there."""
    _make_world_readable(staging_dir)
    if out_dir.exists():
        stale_dir = Path(tempfile.mkdtemp(prefix=f".stale-{out_dir.name}-", dir=out_dir.parent))
        os.rename(out_dir, stale_dir / out_dir.name)
        os.rename(staging_dir, out_dir)
        shutil.rmtree(stale_dir, ignore_errors=True)
        return
    os.rename(staging_dir, out_dir)


def _remove_abandoned_folders(out_dir: Path) -> None:
    """Delete staging/stale folders for `out_dir` left by a process killed mid-conversion."""
    for kind in (".staging-", ".stale-"):
        prefix = f"{kind}{out_dir.name}-"
        for leftover in out_dir.parent.glob(f"{prefix}*"):
            if len(leftover.name) != len(prefix) + _MKDTEMP_SUFFIX_LENGTH:
                continue  # belongs to another cache entry whose name extends ours
            logger.info("Removing abandoned folder %s", leftover)
            shutil.rmtree(leftover, ignore_errors=True)


def convert_gguf_to_hf(gguf_path: Path, out_dir: Path) -> Path:
    """Convert `gguf_path` into the HF folder `out_dir` (replacing it) and return `out_dir`.

    Not safe against a concurrent conversion into the same `out_dir`: callers that may race
    (`resolve_model`) hold a file lock around this call.
    """
    gguf_path, out_dir = Path(gguf_path), Path(out_dir)
    if not gguf_path.is_file():
        raise ConfigurationError("model", f"GGUF file '{gguf_path}' does not exist")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    _remove_abandoned_folders(out_dir)
    staging_dir = Path(tempfile.mkdtemp(prefix=f".staging-{out_dir.name}-", dir=out_dir.parent))
    logger.info("Converting %s into %s", gguf_path, out_dir)
    try:
        _write_model_folder(gguf_path, staging_dir)
        _move_into_place(staging_dir, out_dir)
    except BaseException:
        shutil.rmtree(staging_dir, ignore_errors=True)
        raise
    return out_dir
