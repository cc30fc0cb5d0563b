"""Tenant isolation through the prefix cache on a real stack: requests with different
`cache_salt`s never share cached blocks, over the OpenAI HTTP API (completions and chat) and
over gRPC, while requests with the same salt do (so the check can fail)."""

import uuid

import pytest

from shared.pb.pdserve.v1 import gateway_pb2 as gw
from shared.pb.pdserve.v1 import generation_pb2 as gen
from tests.helpers.raw_http import post

STORY = ("Once upon a time, in a valley between two quiet mountains, there lived a clockmaker who "
         "repaired every clock in the village and kept a notebook of the hours each one had lost. ")


@pytest.fixture(scope="module")
def stack(served_stack):
    return served_stack


def unique_text() -> str:
    """A prompt no other test sent: several full blocks, unique from its first block on."""
    return f"[{uuid.uuid4().hex}] " + STORY * 3


def http_cached_tokens(stack, path: str, body: dict) -> int:
    status, reply, _ = post(stack.stack.ready_info["gateway"]["http_address"], path,
                            {**body, "max_tokens": 1, "temperature": 0}, timeout_s=120)
    assert status == 200, reply
    return reply["usage"]["prompt_tokens_details"]["cached_tokens"]


def grpc_cached_tokens(stack, text: str, salt: str | None) -> int:
    request = gw.GenerateRequest(text=text, sampling=gen.SamplingParams(max_tokens=1, temperature=0))
    if salt is not None:
        request.cache_salt = salt
    return list(stack.gateway.Generate(request, timeout=120))[-1].usage.cached_prompt_tokens


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_differently_salted_http_requests_never_share_blocks(stack, path):
    text = unique_text()
    body = {"prompt": text} if path == "/v1/completions" else {"messages": [{"role": "user", "content": text}]}
    assert http_cached_tokens(stack, path, {**body, "cache_salt": "a1"}) == 0
    num_hit = http_cached_tokens(stack, path, {**body, "cache_salt": "a1"})
    assert num_hit >= 32  # same tenant: a hit
    assert http_cached_tokens(stack, path, {**body, "cache_salt": "b2"}) == 0
    # No salt: never tenant a1's blocks (an unsalted chat may still hit the chat template's
    # default system prompt, cached by other unsalted requests).
    assert http_cached_tokens(stack, path, body) < num_hit
    stack.wait_all_blocks_free()


def test_salts_isolate_across_http_and_grpc(stack):
    text = unique_text()
    assert grpc_cached_tokens(stack, text, "t1") == 0
    assert http_cached_tokens(stack, "/v1/completions", {"prompt": text, "cache_salt": "t1"}) >= 32
    assert http_cached_tokens(stack, "/v1/completions", {"prompt": text, "cache_salt": "t2"}) == 0
    assert grpc_cached_tokens(stack, text, "t3") == 0
    assert grpc_cached_tokens(stack, text, None) == 0
    stack.wait_all_blocks_free()
