"""Guided decoding in the engine, on the tiny random Llama with the hand-made 256-token vocabulary.

The model's random logits would never follow a grammar by chance, so every valid output here is
the mask's doing. Every test checks that all KV blocks are back in the pool at the end.
"""

import json
import re

import pytest

from shared.engine import LLM, SamplingParams
from shared.errors import InvalidRequestError
from shared.guided import GuidedDecodingParams as Guided
from shared.kv_transfer.types import KVConnectorRole, KVTransferConfig
from tests.unit.guided_vocab import EOS_TOKEN_ID, VOCAB, decode, tiny_grammar_cache
from tests.unit.kv_split import IN_MEMORY, run_prefill, send_params

PROMPTS = [[5, 17, 92, 3, 44, 101, 7, 8], [11, 12, 13], [250, 1, 250, 1, 42, 9], list(range(20, 34))]
DATE = r"20[0-9]{2}-[01][0-9]-[0-3][0-9]"
OBJECT_SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "maximum": 99,
                                                                                     "minimum": 0}},
                 "required": ["ok", "n"]}
CHOICES = ["yes", "no", "maybe"]


def make_llm(folder, **kwargs) -> LLM:
    """With the in-memory KV connector in both roles (prefill/decode splits in one engine)."""
    kwargs.setdefault("num_blocks", 64)
    llm = LLM(model=str(folder), dtype="float32", block_size=4,
              kv_transfer=KVTransferConfig(IN_MEMORY, KVConnectorRole.BOTH), **kwargs)
    llm.engine.core.guided.use_grammar_cache(tiny_grammar_cache())
    return llm


def assert_pool_is_whole(llm: LLM):
    pool = llm.engine.core.block_pool
    assert pool.num_free_blocks == pool.num_blocks


def assert_valid(guided: Guided, text: str):
    if guided.regex is not None:
        assert re.fullmatch(guided.regex, text), text
    elif guided.choice is not None:
        assert text in guided.choice
    elif guided.json_schema is not None:
        value = json.loads(text)
        assert set(value) == {"ok", "n"} and isinstance(value["ok"], bool) and 0 <= value["n"] <= 99
    else:
        assert re.fullmatch(r"\((ab)+\)", text), text


CASES = [Guided(regex=DATE), Guided(choice=CHOICES), Guided(json_schema=OBJECT_SCHEMA),
         Guided(grammar='root ::= "(" ("ab")+ ")"')]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_every_output_follows_its_constraint_and_stops(tiny_llama_folder, temperature):
    llm = make_llm(tiny_llama_folder)
    params = [SamplingParams(temperature=temperature, seed=index, max_tokens=40, guided=guided)
              for index, guided in enumerate(CASES)]
    outputs = llm.generate(PROMPTS, params)
    for guided, output in zip(CASES, outputs):
        completion = output.outputs[0]
        assert completion.finish_reason == "stop"
        assert completion.token_ids[-1] == EOS_TOKEN_ID
        assert_valid(guided, decode(completion.token_ids))
    assert_pool_is_whole(llm)


def test_a_finished_grammar_stops_the_request_even_under_ignore_eos(tiny_llama_folder):
    llm = make_llm(tiny_llama_folder)
    params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True, guided=Guided(choice=CHOICES))
    completion = llm.generate(PROMPTS[0], params)[0].outputs[0]
    assert completion.finish_reason == "stop" and completion.token_ids[-1] == EOS_TOKEN_ID
    assert decode(completion.token_ids) in CHOICES


def test_max_tokens_mid_grammar_finishes_with_length(tiny_llama_folder):
    llm = make_llm(tiny_llama_folder)
    params = SamplingParams(temperature=0, max_tokens=3, guided=Guided(regex="[0-9]{20}"))
    completion = llm.generate(PROMPTS[0], params)[0].outputs[0]
    assert completion.finish_reason == "length" and len(completion.token_ids) == 3
    assert re.fullmatch("[0-9]{3,6}", decode(completion.token_ids))
    assert_pool_is_whole(llm)


def test_free_requests_in_a_mixed_batch_match_an_unconstrained_run(tiny_llama_folder):
    free = [SamplingParams(temperature=0, max_tokens=8, ignore_eos=True),
            SamplingParams(temperature=1.0, top_k=30, seed=11, max_tokens=8, ignore_eos=True)]
    alone = [o.outputs[0].token_ids for o in make_llm(tiny_llama_folder).generate(PROMPTS[:2], free)]
    llm = make_llm(tiny_llama_folder)
    guided = [SamplingParams(temperature=t, seed=5, max_tokens=20, guided=g) for t, g in ((0, CASES[0]), (1, CASES[2]))]
    mixed = llm.generate(PROMPTS[:2] + PROMPTS[2:], free + guided)
    assert [o.outputs[0].token_ids for o in mixed[:2]] == alone
    assert_pool_is_whole(llm)


def test_chunked_prefill_and_preemption_give_the_same_guided_output(tiny_llama_folder):
    params = [SamplingParams(temperature=t, seed=3, max_tokens=16, guided=Guided(regex="[0-9]{24}"))
              for t in (0.0, 1.0, 0.0, 1.0)]
    reference = [o.outputs[0].token_ids for o in make_llm(tiny_llama_folder).generate(PROMPTS, params)]
    llm = make_llm(tiny_llama_folder, num_blocks=12, long_prefill_token_threshold=3,
                   enable_prefix_caching=False)
    outputs = llm.generate(PROMPTS, params)
    assert llm.engine.core.scheduler.num_preemptions > 0
    assert [o.outputs[0].token_ids for o in outputs] == reference
    assert all(re.fullmatch("[0-9]+", decode(tokens)) for tokens in reference)
    assert_pool_is_whole(llm)


def test_n_children_each_get_their_own_matcher(tiny_llama_folder):
    llm = make_llm(tiny_llama_folder)
    request_id = llm.engine.add_request(PROMPTS[1], SamplingParams(n=6, temperature=1.0, seed=4, max_tokens=20,
                                                                   guided=Guided(choice=CHOICES)))
    children = llm.engine.requests_of(request_id)
    assert len({id(child.guided_matcher) for child in children}) == 6
    [output] = llm._run([request_id])
    texts = [decode(completion.token_ids) for completion in output.outputs]
    assert all(text in CHOICES for text in texts) and len(set(texts)) > 1
    assert llm.engine.core.guided.grammars.num_misses == 1
    assert_pool_is_whole(llm)


def test_repeated_constraints_are_compiled_once(tiny_llama_folder):
    llm = make_llm(tiny_llama_folder)
    llm.generate(PROMPTS, [SamplingParams(max_tokens=4, guided=Guided(regex=DATE))] * 4)
    grammars = llm.engine.core.guided.grammars
    assert (grammars.num_misses, grammars.num_hits) == (1, 3)


def test_an_invalid_grammar_is_refused_at_admission(tiny_llama_folder):
    llm = make_llm(tiny_llama_folder)
    with pytest.raises(InvalidRequestError) as caught:
        llm.engine.add_request(PROMPTS[0], SamplingParams(guided=Guided(regex="[0-9")))
    assert (caught.value.field, caught.value.message) == ("guided.regex", "Regex parsing error at position 5: Unclosed '['")
    assert not llm.engine.has_unfinished_requests() and not llm.engine.core.scheduler.requests
    with pytest.raises(InvalidRequestError, match="^guided.json_schema: "):
        llm.engine.reserve_request(PROMPTS[0], SamplingParams(guided=Guided(json_schema="{")), "r")
    assert_pool_is_whole(llm)


def test_an_engine_without_a_tokenizer_refuses_guided_requests(tiny_llama_folder):
    llm = LLM(model=str(tiny_llama_folder), dtype="float32", num_blocks=8)
    with pytest.raises(InvalidRequestError, match="^guided: guided decoding needs the model's tokenizer"):
        llm.engine.add_request(PROMPTS[0], SamplingParams(guided=Guided(choice=["a"])))


def run_split(llm: LLM, prompt: list[int], params: SamplingParams) -> tuple[list[int], str]:
    """Prefill under the grammar (max_tokens=1) with the KV sent to a reservation of the same
    engine, then decode from the first token."""
    engine = llm.engine
    reservation = engine.reserve_request(prompt, params, request_id="d")
    first_params = SamplingParams(**{**params.__dict__, "max_tokens": 1, "min_tokens": 0})
    prefilled = run_prefill(engine, prompt, first_params, "p", send_params(engine, reservation, "d"))
    engine.step()
    [output] = engine.start_reserved("d", prefilled.outputs[0].token_ids[0])
    while not output.finished:
        output = next(o for o in engine.step() if o.request_id == "d")
    return output.outputs[0].token_ids, output.outputs[0].finish_reason


@pytest.mark.parametrize("guided", CASES)
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_prefill_decode_split_equals_a_local_run(tiny_llama_folder, guided, temperature):
    params = SamplingParams(temperature=temperature, seed=21, max_tokens=30, guided=guided)
    local = make_llm(tiny_llama_folder).generate(PROMPTS[3], params)[0].outputs[0].token_ids
    llm = make_llm(tiny_llama_folder, enable_prefix_caching=False)
    tokens, reason = run_split(llm, PROMPTS[3], params)
    assert (tokens, reason) == (local, "stop")
    assert_valid(guided, decode(tokens))
    assert_pool_is_whole(llm)


def test_a_first_token_outside_the_grammar_aborts_the_decode(tiny_llama_folder):
    llm = make_llm(tiny_llama_folder)
    reservation = llm.engine.reserve_request(PROMPTS[0], SamplingParams(guided=Guided(choice=CHOICES)), "d")
    run_prefill(llm.engine, PROMPTS[0], SamplingParams(max_tokens=1), "p", send_params(llm.engine, reservation, "d"))
    llm.engine.step()
    [output] = llm.engine.start_reserved("d", VOCAB.index("7"))
    assert output.finished and output.outputs[0].finish_reason == "abort"
    assert_pool_is_whole(llm)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_completed_grammar_wins_over_min_tokens(tiny_llama_folder, temperature):
    """Once the grammar allows only EOS, min_tokens no longer hides it: the request ends with
    "stop" and a valid output shorter than min_tokens (not an abort, not garbage)."""
    llm = make_llm(tiny_llama_folder)
    params = [SamplingParams(temperature=temperature, seed=index, max_tokens=30, min_tokens=20, guided=guided)
              for index, guided in enumerate((Guided(choice=CHOICES), Guided(regex="[0-9]{4}")))]
    outputs = llm.generate(PROMPTS[:2], params)
    for p, output in zip(params, outputs):
        completion = output.outputs[0]
        assert (completion.finish_reason, completion.token_ids[-1]) == ("stop", EOS_TOKEN_ID)
        assert len(completion.token_ids) < p.min_tokens
        assert_valid(p.guided, decode(completion.token_ids))
    assert_pool_is_whole(llm)


def test_min_tokens_still_hides_eos_while_the_grammar_can_go_on(tiny_llama_folder):
    """A regex that may stop after 1 digit or go on to 12: min_tokens=6 keeps it going."""
    llm = make_llm(tiny_llama_folder)
    params = SamplingParams(temperature=0, max_tokens=30, min_tokens=6, guided=Guided(regex="[0-9]{1,12}"))
    completion = llm.generate(PROMPTS[0], params)[0].outputs[0]
    assert completion.finish_reason == "stop"
    assert len(completion.token_ids) >= 6 and re.fullmatch("[0-9]{1,12}", decode(completion.token_ids))
    assert_pool_is_whole(llm)
