"""The prompts' token ids, as the gateway's generation path will compute them, for what the
HTTP layer shapes itself: echoed prompts (with their logprobs) and the running usage of
`stream_options.continuous_usage_stats`. The same function tokenizes both times, so the
counts and the engine's prompt logprobs line up token for token."""

from shared.errors import InvalidRequestError
from shared.pb.pdserve.v1 import gateway_pb2

from services.gateway.http.completion_builder import EchoedPrompt
from services.gateway.request_prep import prompt_token_ids
from services.gateway.served_model import ServedModel


def tokenized(messages: list[gateway_pb2.GenerateRequest], model: ServedModel,
              renamed: dict[str, str]) -> list[list[int]]:
    """Token ids of each message's prompt; errors name the OpenAI field."""
    try:
        return [prompt_token_ids(message, model) for message in messages]
    except InvalidRequestError as error:
        raise InvalidRequestError(renamed.get(error.field, error.field), error.message) from None


def echoed(messages: list[gateway_pb2.GenerateRequest], token_ids: list[list[int]],
           model: ServedModel) -> list[EchoedPrompt]:
    """Text prompts echo as sent; token-id prompts as their decoded text."""
    return [EchoedPrompt(message.text if message.WhichOneof("prompt") == "text" else model.tokenizer.decode(ids),
                         ids) for message, ids in zip(messages, token_ids)]
