"""Text in and out of the engine: tokenizer loading, chat templates, streaming detokenization
and stop strings."""

from shared.tokenization.chat import apply_chat_template, render_chat_prompt, validate_messages
from shared.tokenization.detokenizer import IncrementalDetokenizer
from shared.tokenization.stop_strings import StopStringMatcher
from shared.tokenization.tokenizer import encode_prompt, load_tokenizer

__all__ = [
    "IncrementalDetokenizer",
    "StopStringMatcher",
    "apply_chat_template",
    "encode_prompt",
    "load_tokenizer",
    "render_chat_prompt",
    "validate_messages",
]
