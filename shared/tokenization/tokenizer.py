"""Loading the model's tokenizer and turning a plain prompt into token ids.

The engine calls `load_tokenizer` once at start-up with the model folder (or, before a
converted folder exists, the folder holding the GGUF file), and the request front door
calls `encode_prompt` for every plain-text prompt.
"""

import json
import logging
from pathlib import Path

from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

logger = logging.getLogger(__name__)

# The classes AutoTokenizer resolves to the generic fast tokenizer itself: a folder naming one is
# loaded as that class directly. Same object, but AutoTokenizer's import chain (its config
# classes) imports torch: 240 of the 304 MiB the gateway held after its imports (2026-12-08).
_GENERIC_FAST_CLASSES = frozenset({"TokenizersBackend", "PreTrainedTokenizerFast"})


def load_tokenizer(folder: Path, gguf_file: str | None = None) -> PreTrainedTokenizerBase:
    """Load the fast (Rust) tokenizer stored in `folder`, never touching the network.

    `gguf_file` names a GGUF file inside `folder` to read the tokenizer from instead of
    tokenizer.json. Raises FileNotFoundError when the folder does not exist and
    RuntimeError when only a slow (pure Python) tokenizer is available.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"tokenizer folder {folder} does not exist")
    if gguf_file is None and _declared_class(folder) in _GENERIC_FAST_CLASSES:
        tokenizer = PreTrainedTokenizerFast.from_pretrained(str(folder), local_files_only=True)
    else:
        from transformers import AutoTokenizer

        extra = {"gguf_file": gguf_file} if gguf_file else {}
        tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True, use_fast=True, **extra)
    if not tokenizer.is_fast:
        raise RuntimeError(f"no fast tokenizer found in {folder}")
    logger.info("loaded tokenizer from %s (vocab %d)", folder, len(tokenizer))
    return tokenizer


def _declared_class(folder: Path) -> str | None:
    """The `tokenizer_class` of the folder's tokenizer_config.json (None without one)."""
    try:
        return json.loads((folder / "tokenizer_config.json").read_text()).get("tokenizer_class")
    except (OSError, ValueError, AttributeError):
        return None


def encode_prompt(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    """Token ids of a plain-text prompt, with a BOS only if the tokenizer asks for one.

    The BOS is prepended when the tokenizer's own `add_bos_token` setting is on (Llama-2
    style) and the text does not already start with it; SmolLM2 sets it off, so its
    prompts get no BOS. No EOS is ever added. Special-token markup written in the text
    (e.g. `<|im_start|>`) is parsed as the special token, as chat templates need.
    """
    token_ids = tokenizer.encode(text, add_special_tokens=False)
    bos_token_id = tokenizer.bos_token_id
    wants_bos = bool(getattr(tokenizer, "add_bos_token", False))
    if wants_bos and bos_token_id is not None and token_ids[:1] != [bos_token_id]:
        token_ids.insert(0, bos_token_id)
    return token_ids
