"""Disaggregated serving end to end with real processes: Redis, a gateway, 2 prefill and
2 decode instances (real SmolLM2, bfloat16, one torch thread each, KV over UCX/TCP; the
disaggregated stack of tests/e2e/conftest.py).

Proves: greedy output token-identical to the offline engine; 16 concurrent streams; prefix
routing (a second request sharing a long prefix goes to the prefill instance holding it and
computes fewer prompt tokens); bad input rejected naming the field without affecting other
requests. After every test every instance's free-block count is back at its total.
"""

import threading

import grpc
import pytest

from shared.engine import LLM, SamplingParams
from shared.pb.pdserve.v1 import gateway_pb2, generation_pb2
from tests.helpers.gateway_client import FINISHED, generate, generate_error, generate_request

PROMPTS = [
    "The capital of France is",
    "Write a haiku about the sea.",
    "def fibonacci(n):",
    "Three primary colors are",
]
CHAT = [{"role": "user", "content": "Name two planets of the solar system."}]
LONG_PREFIX = (
    "You are a meticulous librarian. The catalogue below lists every book in the east wing, "
    "with shelf numbers, authors and a one-line summary of each. " * 12
)


@pytest.fixture
def stack(disaggregated_stack):
    return disaggregated_stack


@pytest.fixture
def reference(chunked_reference) -> LLM:
    """The offline engine with the same model, dtype, thread count and prefill chunks as the instances."""
    return chunked_reference


def offline(reference: LLM, prompt, max_tokens: int):
    return reference.generate([prompt], SamplingParams(max_tokens=max_tokens, temperature=0.0))[0]


def test_greedy_output_is_token_identical_to_the_offline_engine(stack, reference):
    for prompt in PROMPTS:
        expected = offline(reference, prompt, max_tokens=16)
        got = generate(stack.gateway, generate_request(text=prompt, max_tokens=16))
        assert got.token_ids == expected.token_ids, prompt
        assert got.text == expected.text, prompt
        assert got.finish_reason in FINISHED
        assert got.usage.prompt_tokens == len(expected.prompt_token_ids)
        assert got.usage.completion_tokens == len(expected.token_ids)


def test_chat_prompt_is_token_identical_to_the_offline_engine(stack, reference):
    expected = reference.chat(CHAT, SamplingParams(max_tokens=12, temperature=0.0))[0]
    got = generate(stack.gateway, generate_request(chat=CHAT, max_tokens=12))
    assert got.token_ids == expected.token_ids
    assert got.text == expected.text


def test_sixteen_concurrent_streams_all_complete(stack):
    results: dict[int, object] = {}

    def run(index: int) -> None:
        request = generate_request(text=f"Story number {index} begins with", max_tokens=8,
                                   ignore_eos=True)
        try:
            results[index] = generate(stack.gateway, request, timeout_s=240)
        except grpc.RpcError as error:
            results[index] = error

    threads = [threading.Thread(target=run, args=(index,)) for index in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    errors = {index: result for index, result in results.items() if isinstance(result, grpc.RpcError)}
    assert not errors, {index: (e.code(), e.details()) for index, e in errors.items()}
    assert sorted(results) == list(range(16))
    for completion in results.values():
        assert len(completion.token_ids) == 8
        assert completion.finish_reason == generation_pb2.FINISH_REASON_LENGTH
        assert completion.usage.completion_tokens == 8


def computed_deltas(before: dict, after: dict) -> dict[str, int]:
    return {name: after[name].num_prompt_tokens_computed - before[name].num_prompt_tokens_computed
            for name in before}


def test_shared_long_prefix_goes_to_the_prefill_instance_holding_it(stack, reference):
    tokenizer = reference.tokenizer
    first_ids = tokenizer.encode(LONG_PREFIX + "First question: where is the atlas?")
    second_ids = tokenizer.encode(LONG_PREFIX + "Second question: who wrote the thesaurus?")
    shared = next(i for i, (a, b) in enumerate(zip(first_ids, second_ids)) if a != b)
    assert shared >= 256, "the prompts must share a long prefix"

    before = stack.statuses("prefill")
    first = generate(stack.gateway, generate_request(token_ids=first_ids, max_tokens=2))
    middle = stack.statuses("prefill")
    deltas = computed_deltas(before, middle)
    holder = max(deltas, key=deltas.get)
    assert deltas[holder] == len(first_ids), deltas
    num_prefix_blocks = shared // 16
    stack.wait_for(lambda: stack.prefix_holders(first_ids, {holder})[holder] >= num_prefix_blocks,
                   10.0, f"the prefix index to show {holder} holding the prefix")

    second = generate(stack.gateway, generate_request(token_ids=second_ids, max_tokens=2))
    after = stack.statuses("prefill")
    deltas = computed_deltas(middle, after)
    assert deltas[holder] > 0 and sum(deltas.values()) == deltas[holder], (
        f"the second request went elsewhere: {deltas}")
    assert deltas[holder] <= len(second_ids) - num_prefix_blocks * 16, deltas
    cached = after[holder].num_cached_prompt_tokens - middle[holder].num_cached_prompt_tokens
    assert cached >= num_prefix_blocks * 16
    assert first.usage.cached_prompt_tokens == 0
    assert second.usage.cached_prompt_tokens >= num_prefix_blocks * 16


INVALID = [
    ("temperature", generate_request(text="hi", temperature=-1.0)),
    ("top_p", generate_request(text="hi", top_p=1.5)),
    ("max_tokens", generate_request(text="hi", max_tokens=0)),
    ("n", generate_request(text="hi", n=0)),
    ("text", generate_request(text="")),
    ("prompt", generate_request()),
    ("token_ids", generate_request(token_ids=[1, 2, 10_000_000])),
    ("token_ids", generate_request(token_ids=[5] * 9000)),
    ("request_id", generate_request(text="hi", request_id="bad id with spaces")),
    ("chat", generate_request(chat=[{"role": "nobody", "content": "hi"}])),
]


@pytest.mark.parametrize("field, request_message", INVALID, ids=[f"{f}-{i}" for i, (f, _) in enumerate(INVALID)])
def test_invalid_requests_get_invalid_argument_naming_the_field(stack, field, request_message):
    error = generate_error(stack.gateway, request_message)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()
    assert error.details().startswith(field), error.details()


def test_unknown_model_is_not_found(stack):
    error = generate_error(stack.gateway, generate_request(text="hi", model="no-such-model"))
    assert error.code() == grpc.StatusCode.NOT_FOUND
    assert "no-such-model" in error.details()


def test_list_models_names_the_served_model(stack, smollm2_folder):
    reply = stack.gateway.ListModels(gateway_pb2.ListModelsRequest(), timeout=10)
    assert [card.id for card in reply.models] == [smollm2_folder.name]
    assert reply.models[0].max_model_len > 0


def test_bad_requests_do_not_affect_a_request_in_flight(stack, reference):
    prompt = PROMPTS[0]
    expected = offline(reference, prompt, max_tokens=24)
    stream = stack.gateway.Generate(generate_request(text=prompt, max_tokens=24), timeout=120)
    first = next(stream)
    for _, bad in INVALID[:6]:
        assert generate_error(stack.gateway, bad).code() == grpc.StatusCode.INVALID_ARGUMENT
    assert generate_error(stack.gateway, generate_request(text="x", model="nope")).code() == \
        grpc.StatusCode.NOT_FOUND
    token_ids = list(first.token_ids)
    for message in stream:
        token_ids.extend(message.token_ids)
    assert token_ids == expected.token_ids
