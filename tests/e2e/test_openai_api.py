"""The OpenAI-compatible HTTP API of a real stack (Redis, a gateway, one prefill and one
decode instance with the real SmolLM2), driven by the official `openai` client: greedy
answers over HTTP equal the gRPC API's, streamed and not, and no blocks are left held."""

import openai
import pytest

from tests.helpers.gateway_client import generate, generate_request
from tests.helpers.stack import running_stack

DTYPE = "bfloat16"
CHAT = [{"role": "user", "content": "Name two planets of the solar system."}]
PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def stack(smollm2_folder, tmp_path_factory):
    yield from running_stack(smollm2_folder, DTYPE, num_prefill=1, num_decode=1,
                             run_dir=tmp_path_factory.mktemp("stack"),
                             extra_args={"instance": ["--num-blocks", "256"]})


@pytest.fixture
def client(stack):
    http_address = stack.stack.ready_info["gateway"]["http_address"]
    with openai.OpenAI(base_url=f"http://{http_address}/v1", api_key="unused", max_retries=0,
                       timeout=120) as http_client:
        yield http_client
    stack.wait_all_blocks_free()
    stack.check_children_alive()


def test_chat_completion_equals_the_grpc_answer(stack, client):
    expected = generate(stack.gateway, generate_request(chat=CHAT, max_tokens=12))
    reply = client.chat.completions.create(model=stack.model_folder.name, messages=CHAT,
                                           max_completion_tokens=12, temperature=0)
    assert reply.choices[0].message.content == expected.text
    assert reply.choices[0].finish_reason == "length"
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (
        expected.usage.prompt_tokens, expected.usage.completion_tokens)


def test_streamed_completion_equals_the_grpc_answer(stack, client):
    expected = generate(stack.gateway, generate_request(text=PROMPT, max_tokens=16))
    stream = client.completions.create(model=stack.model_folder.name, prompt=PROMPT, max_tokens=16,
                                       temperature=0, stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    assert "".join(c.text for chunk in chunks for c in chunk.choices) == expected.text
    assert len(chunks) > 2  # really streamed, not one block
    assert chunks[-1].usage.completion_tokens == len(expected.token_ids) == 16
