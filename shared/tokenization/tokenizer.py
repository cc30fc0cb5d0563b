"""Loading the model's tokenizer and turning a plain prompt into token ids.

The engine calls `load_tokenizer` once at start-up with the model folder (or, before a
converted folder exists, the folder holding the GGUF file), and the request front door
calls `encode_prompt` for every plain-text prompt.
"""

import logging
from pathlib import Path

from transformers import AutoTokenizer, PreTrainedTokenizerBase

logger = logging.getLogger(__name__)


def load_tokenizer(folder: Path, gguf_file: str | None = None) -> PreTrainedTokenizerBase:
    """Load the fast (Rust) tokenizer stored in `folder`, never touching the network.

    `gguf_file` names a GGUF file inside `folder` to read the tokenizer from instead of
    tokenizer.json. Raises FileNotFoundError when the folder does not exist and
    RuntimeError when only a slow (pure Python) tokenizer is available.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"tokenizer folder {folder} does not exist")
    extra = {"gguf_file": gguf_file} if gguf_file else {}
    tokenizer = AutoTokenizer.from_pretrained(
        str(folder), local_files_only=True, use_fast=True, **extra
    )
    if not tokenizer.is_fast:
        raise RuntimeError(f"no fast tokenizer found in {folder}")
    logger.info("loaded tokenizer from %s (vocab %d)", folder, len(tokenizer))
    return tokenizer


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
