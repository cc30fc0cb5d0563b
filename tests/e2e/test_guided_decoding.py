"""Guided decoding on the real SmolLM2: every output parses and validates, for a dozen JSON
schemas, regexes, a choice and an EBNF grammar, at temperature 0 and 1; the same under small
prefill chunks and preemption; and through a real prefill -> decode stack (the prefill instance
samples the first token under the grammar, the decode instance continues the matcher).
"""

import copy
import dataclasses
import json
import re

import grpc
import jsonschema
import pytest

from shared.engine import LLM, LLMEngine, SamplingParams
from shared.engine.loading import kv_cache_layout
from shared.model.dtypes import parse_dtype
from shared.executor.in_process import InProcessExecutor
from shared.guided import GuidedDecodingParams as Guided
from shared.pb.pdserve.v1 import gateway_pb2, generation_pb2
from shared.tokenization.chat import apply_chat_template
from shared.wire.sampling import sampling_to_proto
from tests.helpers.gateway_client import generate, generate_error, generate_request
from tests.helpers.grammar_walk import assert_grammar_allows
from tests.helpers.greedy_compare import assert_greedy_agrees

DTYPE = "bfloat16"
# Enough for every bounded constraint below (strings have a maxLength, arrays a maxItems);
# "any JSON object" has no bound, so a sampled one gets more room to close its braces.
MAX_TOKENS = 160
MAX_TOKENS_OPEN_ENDED = 400

PERSON = {"type": "object", "properties": {
    "name": {"type": "string", "minLength": 1, "maxLength": 20},
    "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "hobbies": {"type": "array", "items": {"type": "string", "enum": ["chess", "music", "hiking", "cooking"]},
                "minItems": 1, "maxItems": 3}},
    "required": ["name", "age", "hobbies"]}
ORDER = {"type": "object", "properties": {
    "order_id": {"type": "integer", "minimum": 1, "maximum": 99999},
    "items": {"type": "array", "minItems": 1, "maxItems": 3, "items": {
        "type": "object", "properties": {"sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{3}$"},
                                         "quantity": {"type": "integer", "minimum": 1, "maximum": 9}},
        "required": ["sku", "quantity"]}},
    "shipping": {"type": "object", "properties": {
        "method": {"type": "string", "enum": ["standard", "express"]},
        "address": {"type": "object", "properties": {
            "city": {"type": "string", "minLength": 1, "maxLength": 15},
            "zip": {"type": "string", "pattern": "^[0-9]{5}$"}}, "required": ["city", "zip"]}},
        "required": ["method", "address"]}},
    "required": ["order_id", "items", "shipping"]}
REVIEW = {"type": "object", "properties": {
    "sentiment": {"enum": ["positive", "negative", "mixed"]},
    "stars": {"type": "integer", "minimum": 1, "maximum": 5},
    "verified": {"type": "boolean"},
    "summary": {"type": "string", "minLength": 1, "maxLength": 40}},
    "required": ["sentiment", "stars", "verified", "summary"]}
SHAPE = {"type": "object", "properties": {"shape": {"anyOf": [
    {"type": "object", "properties": {"kind": {"const": "circle"},
                                      "radius": {"type": "integer", "minimum": 1, "maximum": 100}},
     "required": ["kind", "radius"]},
    {"type": "object", "properties": {"kind": {"const": "square"},
                                      "side": {"type": "integer", "minimum": 1, "maximum": 100}},
     "required": ["kind", "side"]}]}}, "required": ["shape"]}
ARITHMETIC = """root ::= number (" " operator " " number){1,3}
number ::= [1-9] [0-9]{0,2}
operator ::= "+" | "-" | "*"
"""
ARITHMETIC_PATTERN = r"[1-9][0-9]{0,2}( [-+*] [1-9][0-9]{0,2}){1,3}"

# (guided, question), each validated by `check` below.
CASES = [
    (Guided(json_schema=PERSON), "Describe a fictional person as JSON."),
    (Guided(json_schema=json.dumps(ORDER)), "Create a small online shop order as JSON."),
    (Guided(json_schema=REVIEW), "Review a coffee machine as JSON."),
    (Guided(json_schema=SHAPE), "Describe a geometric shape as JSON."),
    (Guided(json_object=True), "Give a tiny JSON object with one key about the weather."),
    (Guided(regex=r"(19|20)[0-9]{2}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])"), "When did the Berlin wall fall?"),
    (Guided(regex=r"[a-z]{1,12}\.[a-z]{1,12}@[a-z]{1,10}\.(com|org|net)"), "Invent an email address."),
    (Guided(regex=r"\([0-9]{3}\) [0-9]{3}-[0-9]{4}"), "Invent a US phone number."),
    (Guided(regex=r"([01][0-9]|2[0-3]):[0-5][0-9]"), "What time is lunch?"),
    (Guided(regex="#[0-9a-f]{6}"), "What is the hex color of the sky?"),
    (Guided(choice=["positive", "negative", "neutral"]), "Sentiment of: 'I love this phone!'"),
    (Guided(grammar=ARITHMETIC), "Write a small arithmetic expression."),
]


def check(guided: Guided, text: str) -> None:
    """Raise unless `text` satisfies the constraint (jsonschema / re.fullmatch / membership)."""
    if guided.json_schema is not None:
        schema = guided.json_schema
        jsonschema.validate(json.loads(text), json.loads(schema) if isinstance(schema, str) else schema)
    elif guided.json_object:
        assert isinstance(json.loads(text), dict), text
    elif guided.regex is not None:
        assert re.fullmatch(guided.regex, text), text
    elif guided.choice is not None:
        assert text in guided.choice, text
    else:
        assert re.fullmatch(ARITHMETIC_PATTERN, text), text


@pytest.fixture(scope="module")
def llm(smollm2_folder) -> LLM:
    return LLM(model=str(smollm2_folder), dtype=DTYPE, num_threads=1)


def chat_prompt(llm: LLM, question: str) -> list[int]:
    return apply_chat_template(llm.tokenizer, [{"role": "user", "content": question}])


def case_params(temperature: float) -> list[SamplingParams]:
    return [SamplingParams(temperature=temperature, seed=index, guided=guided,
                           max_tokens=MAX_TOKENS_OPEN_ENDED if guided.json_object else MAX_TOKENS)
            for index, (guided, _) in enumerate(CASES)]


def assert_all_valid(llm: LLM, outputs, params: list[SamplingParams]) -> None:
    """Every output validates. "Any JSON object" is the one constraint with no bound on its
    length, and this 135M model can repeat a key until max_tokens, greedy or sampled (which
    depends on bf16 rounding and the draw): such an output is accepted when the grammar allowed
    every one of its tokens (its text is then an unfinished object), so the test does not depend
    on where the model stops."""
    for output, p in zip(outputs, params):
        completion = output.outputs[0]
        if p.guided.json_object and completion.finish_reason == "length":
            assert len(completion.token_ids) == p.max_tokens and completion.text.startswith("{")
            core = llm.engine.core
            assert_grammar_allows(core.guided.grammars.compile(p.guided), core.model_config.vocab_size,
                                  list(completion.token_ids), complete=False)
            continue
        assert completion.finish_reason == "stop", (p.guided, completion.text)
        check(p.guided, completion.text)


def test_every_output_validates_at_temperature_0_and_1(llm):
    prompts = [chat_prompt(llm, question) for _, question in CASES] * 2
    params = case_params(0.0) + case_params(1.0)
    outputs = llm.generate(prompts, params)
    grammars = llm.engine.core.guided.grammars
    assert (grammars.num_misses, grammars.num_hits) == (len(CASES), len(CASES))
    assert_all_valid(llm, outputs, params)
    assert llm.engine.core.block_pool.num_free_blocks == llm.engine.core.block_pool.num_blocks


def small_cache_engine(llm: LLM, num_blocks: int, chunk_tokens: int) -> LLMEngine:
    """An engine on the same weights with a tiny KV cache and small prefill chunks."""
    core = llm.engine.core
    config = copy.deepcopy(core.config)
    config.cache.num_blocks = num_blocks
    config.cache.enable_prefix_caching = False
    config.scheduler.long_prefill_token_threshold = chunk_tokens
    layout = kv_cache_layout(config, core.model_config, parse_dtype(config.dtype))
    executor = InProcessExecutor(core.executor.runner.model, layout)
    return LLMEngine(config, core.model_config, executor, llm.tokenizer, core.kv_manager.model_key)


def test_small_chunks_and_preemption_still_validate(llm):
    """Six ~40-token prompts and their outputs cannot all fit 12 blocks of 16 tokens."""
    engine = small_cache_engine(llm, num_blocks=12, chunk_tokens=8)
    chosen = [0, 2, 8, 6, 11, 3]
    params = [dataclasses.replace(case_params(1.0)[index], max_tokens=100) for index in chosen]
    for index, p in zip(chosen, params):
        engine.add_request(chat_prompt(llm, CASES[index][1]), p, request_id=str(index))
    finished = {}
    while engine.has_unfinished_requests():
        finished.update((o.request_id, o) for o in engine.step() if o.finished)
    assert engine.core.scheduler.num_preemptions > 0
    assert_all_valid(llm, [finished[str(index)] for index in chosen], params)
    assert engine.core.block_pool.num_free_blocks == engine.core.block_pool.num_blocks


@pytest.fixture(scope="module")
def stack(served_stack):
    """The bf16 prefill + decode stack the request-only modules share (tests/e2e/conftest.py)."""
    return served_stack


def stack_request(llm: LLM, index: int, temperature: float) -> gateway_pb2.GenerateRequest:
    request = generate_request(token_ids=chat_prompt(llm, CASES[index][1]))
    request.sampling.CopyFrom(sampling_to_proto(case_params(temperature)[index]))
    return request


def test_prefill_and_decode_instances_share_the_grammar(llm, stack):
    """Through gateway -> prefill -> decode, every token is one the grammar allowed at its step
    (the prefill instance's first token, and the decode instance's matcher continuing from it),
    and greedy output equals the offline engine's token for token up to a bf16 near-tie among
    the allowed tokens (a choice has several tokenizations: "n" "eg" "ative" and "n" "eg" "at"
    "iv" "e" both spell "negative", and their logits can tie in bf16); sampled outputs validate
    and walk the grammar too."""
    computed_before = sum(status.num_prompt_tokens_computed for status in stack.statuses("prefill").values())
    vocab_size = llm.engine.core.guided.vocab_size
    for index in (7, 10):
        prompt = chat_prompt(llm, CASES[index][1])
        compiled = llm.engine.core.guided.grammars.compile(CASES[index][0])
        expected = llm.generate(prompt, case_params(0.0)[index])[0].outputs[0]
        got = generate(stack.gateway, stack_request(llm, index, 0.0))
        assert_grammar_allows(compiled, vocab_size, list(got.token_ids))
        assert_grammar_allows(compiled, vocab_size, expected.token_ids)
        assert_greedy_agrees(llm, prompt, list(got.token_ids), expected.token_ids)
        assert got.finish_reason == generation_pb2.FINISH_REASON_STOP
        check(CASES[index][0], got.text)
    for index in (5, 11):
        got = generate(stack.gateway, stack_request(llm, index, 1.0))
        check(CASES[index][0], got.text)
        assert_grammar_allows(llm.engine.core.guided.grammars.compile(CASES[index][0]), vocab_size, list(got.token_ids))
    computed = sum(status.num_prompt_tokens_computed for status in stack.statuses("prefill").values())
    assert computed > computed_before  # the prompts went through the prefill instance
    stack.wait_all_blocks_free()


def test_an_invalid_regex_is_refused_with_xgrammars_message(llm, stack):
    request = generate_request(text="hi")
    request.sampling.guided.regex = "[0-9"
    error = generate_error(stack.gateway, request)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details() == "guided.regex: Regex parsing error at position 5: Unclosed '['"
    stack.wait_all_blocks_free()
