"""Rendering an OpenAI-style chat conversation into the model's prompt.

The chat front door calls `apply_chat_template` (token ids for the engine) or
`render_chat_prompt` (the prompt text, e.g. for logging or /tokenize) once per request.
Both validate the messages first and raise InvalidRequestError('messages', ...) for
anything the template cannot render.
"""

from jinja2 import TemplateError
from transformers import PreTrainedTokenizerBase

from shared.errors import InvalidRequestError

CHAT_ROLES = ("system", "user", "assistant", "tool")


def render_chat_prompt(
    tokenizer: PreTrainedTokenizerBase,
    messages: list[dict[str, str]],
    add_generation_prompt: bool = True,
) -> str:
    """The prompt text the tokenizer's chat template makes of `messages`.

    `add_generation_prompt` appends the markup that opens the assistant's turn
    (`<|im_start|>assistant\\n` for SmolLM2), so the model answers rather than continues.
    """
    validate_messages(messages)
    if not getattr(tokenizer, "chat_template", None):
        raise InvalidRequestError(
            "messages", "this model's tokenizer has no chat template; send a plain prompt"
        )
    try:
        return tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt
        )
    except TemplateError as error:
        raise InvalidRequestError(
            "messages", f"the chat template rejected them: {error}"
        ) from error


def apply_chat_template(
    tokenizer: PreTrainedTokenizerBase,
    messages: list[dict[str, str]],
    add_generation_prompt: bool = True,
) -> list[int]:
    """Token ids of the rendered chat prompt, ready to hand to the engine.

    The template writes its own special tokens (a BOS too, where the model wants one),
    so the text is encoded without adding any more.
    """
    prompt_text = render_chat_prompt(tokenizer, messages, add_generation_prompt)
    return tokenizer.encode(prompt_text, add_special_tokens=False)


def validate_messages(messages: list[dict[str, str]]) -> None:
    """Raise InvalidRequestError('messages', ...) unless every message is well formed.

    A well-formed conversation is a non-empty list of dicts, each with a `role` among
    CHAT_ROLES and a string `content`; other keys (e.g. `name`) pass through untouched.
    """
    if not isinstance(messages, list) or not messages:
        raise InvalidRequestError("messages", "must be a non-empty list of messages")
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            raise InvalidRequestError("messages", f"item {index} must be an object")
        role = message.get("role")
        if role not in CHAT_ROLES:
            raise InvalidRequestError(
                "messages", f"item {index} has role {role!r}; expected one of {list(CHAT_ROLES)}"
            )
        if not isinstance(message.get("content"), str):
            raise InvalidRequestError("messages", f"item {index} must have string content")
