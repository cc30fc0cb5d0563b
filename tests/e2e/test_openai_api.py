"""The OpenAI-compatible HTTP API of a real stack (Redis, a gateway, one prefill and one
decode instance with the real SmolLM2), driven by the official `openai` client: greedy
answers over HTTP equal the gRPC API's, streamed and not, and no blocks are left held.

The stack computes in bf16, whose sums depend on how a prompt is batched (on CPUs with bf16
hardware a prefix-cache hit alone changes them), so each compared request carries a cache salt
of its own: both sides are computed from scratch, alone, the same way, and must then agree
exactly."""

import pytest

import uuid

from tests.helpers.gateway_client import generate, generate_request

CHAT = [{"role": "user", "content": "Name two planets of the solar system."}]
PROMPT = "The capital of France is"


def fresh_grpc(request):
    """The request with a cache salt of its own (computed from scratch: module docstring)."""
    request.cache_salt = uuid.uuid4().hex
    return request


def fresh_http() -> dict:
    return {"extra_body": {"cache_salt": uuid.uuid4().hex}}


@pytest.fixture(scope="module")
def stack(served_stack):
    return served_stack


def test_chat_completion_equals_the_grpc_answer(stack, client):
    expected = generate(stack.gateway, fresh_grpc(generate_request(chat=CHAT, max_tokens=12)))
    reply = client.chat.completions.create(model=stack.model_folder.name, messages=CHAT,
                                           max_completion_tokens=12, temperature=0, **fresh_http())
    assert reply.choices[0].message.content == expected.text
    assert reply.choices[0].finish_reason == "length"
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (
        expected.usage.prompt_tokens, expected.usage.completion_tokens)


def test_streamed_completion_equals_the_grpc_answer(stack, client):
    expected = generate(stack.gateway, fresh_grpc(generate_request(text=PROMPT, max_tokens=16)))
    stream = client.completions.create(model=stack.model_folder.name, prompt=PROMPT, max_tokens=16,
                                       temperature=0, stream=True, stream_options={"include_usage": True},
                                       **fresh_http())
    chunks = list(stream)
    assert "".join(c.text for chunk in chunks for c in chunk.choices) == expected.text
    assert len(chunks) > 2  # really streamed, not one block
    assert chunks[-1].usage.completion_tokens == len(expected.token_ids) == 16
