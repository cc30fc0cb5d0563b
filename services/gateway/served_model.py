"""What the gateway knows about the model it serves: names, tokenizer, limits.

The gateway needs no weights: only the folder's tokenizer and config.json, and the folder's
name (`resolve_model(model).name`), which names the Redis namespace the instances of this
model register in. How prompts are hashed into blocks (block size, algorithm, model id) it
learns from each instance's registered cache settings, not from its own flags.
"""

import logging
from dataclasses import dataclass, field
from typing import Any

from shared.model.config import ModelConfig
from shared.model.default_model import DEFAULT_MODEL_NAME, model_folder

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServedModel:
    name: str  # what clients put in `model`
    model_key: str  # the model folder's name: the Redis namespace's model
    tokenizer: Any
    vocab_size: int
    max_model_len: int
    aliases: frozenset[str] = field(default_factory=frozenset)  # other accepted names

    def accepts(self, requested: str) -> bool:
        """An empty name means the served model."""
        return requested in ("", self.name) or requested in self.aliases


def load_served_model(model: str | None, served_model_name: str | None,
                      max_model_len: int | None = None) -> ServedModel:
    """Read tokenizer and config from the model folder (blocking: seconds)."""
    from shared.tokenization import load_tokenizer

    model = model or None  # "" also means the default model
    folder = model_folder(model)
    config = ModelConfig.from_folder(folder)
    tokenizer = load_tokenizer(folder)
    limit = config.max_position_embeddings
    if max_model_len is not None:
        limit = min(limit, max_model_len)
    requested_name = DEFAULT_MODEL_NAME if model in (None, DEFAULT_MODEL_NAME) else str(model)
    aliases = {folder.name, requested_name}
    name = served_model_name or (DEFAULT_MODEL_NAME if model in (None, DEFAULT_MODEL_NAME) else folder.name)
    logger.info("serving %s (key %s, max_model_len %d)", name, folder.name, limit)
    return ServedModel(name=name, model_key=folder.name, tokenizer=tokenizer,
                       vocab_size=config.vocab_size, max_model_len=limit,
                       aliases=frozenset(aliases - {name}))
