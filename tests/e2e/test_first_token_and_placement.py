"""The early first token and conditional disaggregation with real processes: Redis, a gateway,
2 prefill and 1 decode instances (real SmolLM2, float32 so that greedy output is exact across
paths, one torch thread each, KV over UCX/TCP); the gateway prefills prompts of at most
LOCAL_MAX_TOKENS uncached tokens on the decode instance.

Proves, by events, never by timings:
- greedy output equals the offline engine's for a prompt prefilled on the pool and for one
  prefilled on the decode instance (gRPC and OpenAI SSE), with stop strings and max_tokens 1;
  the short prompt ran on the decode instance, the long one on the pool, and the gateway's
  metric counted both;
- the client gets the first token while the decode instance holding the reservation is frozen
  (SIGSTOP: its KV receiver cannot acknowledge the transfer, it cannot serve Decode), so before
  the Decode stream starts; and the prefill instance killed before it could answer (frozen
  while the decode instance thaws) loses nothing and duplicates nothing: the other prefill
  instance fills the same reservation and Decode starts from the token the client has.
After every test every live instance's blocks are free again.
"""

import threading

import openai
import pytest

from shared.engine import LLM, SamplingParams
from tests.helpers.freeze import Frozen
from tests.helpers.gateway_client import generate, generate_request, random_token_ids
from tests.helpers.stack import running_stack
from tests.unit.metrics_scrape import scrape

DTYPE = "float32"
LOCAL_MAX_TOKENS = 24
SHORT_PROMPT = "The capital of France is"  # a handful of tokens: prefilled on the decode instance
LONG_PROMPT = ("You are a meticulous librarian. The catalogue below lists every book in the east wing, "
               "with shelf numbers, authors and a one-line summary of each. " * 4 + "The first book is")


@pytest.fixture(scope="module")
def stack(smollm2_folder, tmp_path_factory):
    yield from running_stack(smollm2_folder, DTYPE, num_prefill=2, num_decode=1,
                             run_dir=tmp_path_factory.mktemp("stack"), extra_args={
        "instance": ["--num-blocks", "256"],
        "gateway": ["--local-prefill-max-tokens", str(LOCAL_MAX_TOKENS), "--local-prefill-busy-max-tokens", "0"]})


@pytest.fixture(scope="module")
def reference(smollm2_folder) -> LLM:
    return LLM(model=str(smollm2_folder), dtype=DTYPE, num_threads=1)


@pytest.fixture(autouse=True)
def no_stranded_blocks(stack):
    stack.check_children_alive()
    yield
    stack.wait_all_blocks_free()


def greedy(reference: LLM, prompt, max_tokens: int, **extra):
    return reference.generate([prompt], SamplingParams(max_tokens=max_tokens, temperature=0.0, **extra))[0]


def gateway_counter(stack, name: str) -> float:
    samples = scrape(stack.stack.ready_info["gateway"]["http_address"])
    return sum(count for (sample_name, _), count in samples.items() if sample_name == name)


def placement_counts(stack) -> dict[tuple[str, str], float]:
    """The gateway's pdserve:gateway_prefill_placement_total, by (where, reason)."""
    samples = scrape(stack.stack.ready_info["gateway"]["http_address"])
    return {(dict(labels)["where"], dict(labels)["reason"]): count for (name, labels), count in samples.items()
            if name == "pdserve:gateway_prefill_placement_total"}


def test_greedy_output_is_the_same_prefilled_on_the_pool_or_on_the_decode_instance(stack, reference):
    tokenizer = reference.tokenizer
    assert len(tokenizer.encode(SHORT_PROMPT)) <= LOCAL_MAX_TOKENS < len(tokenizer.encode(LONG_PROMPT))
    before = placement_counts(stack)
    local_before = sum(s.num_local_prefills for s in stack.statuses("decode").values())
    computed_before = sum(s.num_prompt_tokens_computed for s in stack.statuses("prefill").values())
    for prompt in (SHORT_PROMPT, LONG_PROMPT):
        expected = greedy(reference, prompt, max_tokens=12)
        messages = list(stack.gateway.Generate(generate_request(text=prompt, max_tokens=12), timeout=120))
        assert list(messages[0].token_ids) == expected.token_ids[:1]  # the first token alone, first
        assert [t for m in messages for t in m.token_ids] == expected.token_ids
        assert "".join(m.text for m in messages) == expected.text
        assert messages[-1].usage.completion_tokens == 12
    after = placement_counts(stack)
    assert after.get(("decode_local", "short_prompt"), 0) == before.get(("decode_local", "short_prompt"), 0) + 1
    assert after.get(("prefill_pool", "long_prompt"), 0) == before.get(("prefill_pool", "long_prompt"), 0) + 1
    assert sum(s.num_local_prefills for s in stack.statuses("decode").values()) == local_before + 1
    computed = sum(s.num_prompt_tokens_computed for s in stack.statuses("prefill").values()) - computed_before
    assert computed == len(tokenizer.encode(LONG_PROMPT))  # the pool never saw the short prompt


def test_stop_strings_one_token_and_sse_streams_through_both_paths(stack, reference):
    long_text = greedy(reference, LONG_PROMPT, max_tokens=16).text
    stop = long_text[len(long_text) // 2:len(long_text) // 2 + 3]
    for prompt, params in ((LONG_PROMPT, {"stop": [stop]}), (LONG_PROMPT, {"max_tokens": 1}),
                           (SHORT_PROMPT, {"max_tokens": 1})):
        params = {"max_tokens": 16, **params}
        expected = greedy(reference, prompt, **params)
        got = generate(stack.gateway, generate_request(text=prompt, **params))
        assert (got.token_ids, got.text) == (expected.token_ids, expected.text), params
        assert got.usage.completion_tokens == len(expected.token_ids)
    http_address = stack.stack.ready_info["gateway"]["http_address"]
    with openai.OpenAI(base_url=f"http://{http_address}/v1", api_key="unused", max_retries=0, timeout=120) as client:
        for prompt in (SHORT_PROMPT, LONG_PROMPT):
            expected = greedy(reference, prompt, max_tokens=10)
            chunks = list(client.completions.create(model=stack.model_folder.name, prompt=prompt, max_tokens=10,
                                                    temperature=0, stream=True))
            assert "".join(chunk.choices[0].text for chunk in chunks) == expected.text
            assert chunks[-1].choices[0].finish_reason == "length"


def test_the_first_token_comes_before_decode_and_a_prefill_killed_then_loses_nothing(stack, reference):
    prompt = random_token_ids(48, seed=32)  # longer than LOCAL_MAX_TOKENS: prefilled on the pool
    expected = greedy(reference, prompt, max_tokens=10)
    prefills, [decode] = stack.instances("prefill"), stack.instances("decode")
    computed = {p.name: stack.status(p).num_prompt_tokens_computed for p in prefills}
    retries = gateway_counter(stack, "pdserve:gateway_prefill_retries_total")
    first_read, result = threading.Event(), {}

    def client():
        messages = stack.gateway.Generate(generate_request(token_ids=prompt, max_tokens=10), timeout=180)
        result["messages"] = [next(messages)]
        first_read.set()
        result["messages"] += list(messages)

    thread = threading.Thread(target=client)
    with Frozen(*prefills) as frozen_prefills:  # the prompt waits for a prefill instance ...
        thread.start()
        stack.wait_for(lambda: stack.status(decode).num_reserved == 1, 60.0, "the reservation")
        with Frozen(decode) as frozen_decode:  # ... whose KV cannot land now: Decode cannot start
            frozen_prefills.thaw()
            assert first_read.wait(120), "the first token did not come while the KV was in flight"
            [serving] = [p for p in prefills if stack.status(p).num_prompt_tokens_computed > computed[p.name]]
            with Frozen(serving):  # the KV's acknowledgement stays unread: it never answers
                frozen_decode.thaw()
                stack.kill(serving)
    thread.join(180)
    messages = result["messages"]
    assert list(messages[0].token_ids) == expected.token_ids[:1]
    assert [t for m in messages for t in m.token_ids] == expected.token_ids  # nothing lost, nothing twice
    assert "".join(m.text for m in messages) == expected.text
    assert messages[-1].usage.completion_tokens == 10
    assert gateway_counter(stack, "pdserve:gateway_prefill_retries_total") == retries + 1  # into the same reservation
