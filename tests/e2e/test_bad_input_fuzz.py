"""Property-based bad input against a real stack (Redis, gateway, one prefill and one decode
instance, SmolLM2): hypothesis builds invalid OpenAI HTTP bodies and invalid gRPC
GenerateRequests, each a valid request with one thing broken, and every answer must be a 4xx
in OpenAI's shape (HTTP) or INVALID_ARGUMENT / NOT_FOUND (gRPC), quickly, with no process
dying and every KV block back afterwards. Examples are derandomized: the same corpus every run.
"""

import json
import time

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shared.pb.pdserve.v1 import gateway_pb2 as gw
from shared.pb.pdserve.v1 import generation_pb2 as gen
from shared.memory.process import resident_bytes
from tests.helpers.raw_http import assert_openai_error, post

MAX_ANSWER_S = 30.0
MAX_GATEWAY_GROWTH_BYTES = 50 << 20
FUZZ = settings(max_examples=120, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
VOCAB_SIZE = 49152
SURROGATES = st.sampled_from(["\ud800", "a\udfffb", "\udbff\udc00x\ud800"])
TEXT = st.text(max_size=20)
# Strings that no lax parser reads as a number.
NOT_NUMBERS = st.sampled_from(["", "hot", "1e", "two"])


@pytest.fixture(scope="module")
def stack(served_stack):
    yield served_stack
    served_stack.wait_all_blocks_free()
    served_stack.check_children_alive()


@pytest.fixture(scope="module", autouse=True)
def gateway_rss_before_the_corpus(stack) -> int:
    return resident_bytes(stack.stack.gateway.pid)


def with_surrogate(text: str, surrogate: str) -> str:
    return text + surrogate


# ---- HTTP: one broken field per body -------------------------------------------------------

def _broken_fields():
    """(field, bad value) pairs that no OpenAI-compatible server may accept."""
    surrogate_text = st.builds(with_surrogate, TEXT, SURROGATES)
    return st.one_of(
        st.tuples(st.just("temperature"), st.one_of(st.floats(max_value=-0.01, allow_nan=False), NOT_NUMBERS)),
        st.tuples(st.just("top_p"), st.one_of(st.floats(min_value=1.01, allow_infinity=False), st.just(0),
                                                st.floats(max_value=-0.01, allow_nan=False))),
        st.tuples(st.just("top_k"), st.integers(max_value=-2)),
        st.tuples(st.just("n"), st.one_of(st.integers(max_value=0), st.integers(min_value=33), NOT_NUMBERS)),
        st.tuples(st.just("max_tokens"), st.one_of(st.integers(max_value=0), NOT_NUMBERS)),
        st.tuples(st.just("min_p"), st.floats(min_value=1.01, allow_infinity=False)),
        st.tuples(st.just("stop"), st.one_of(st.lists(st.just("s"), min_size=33, max_size=40), surrogate_text,
                                             st.integers())),
        st.tuples(st.just("stop_token_ids"), st.lists(st.integers(min_value=VOCAB_SIZE, max_value=2**31),
                                                      min_size=1, max_size=3)),
        st.tuples(st.just("model"), st.one_of(st.text(min_size=1).map(lambda t: "no-such-model-" + t),
                                              surrogate_text, st.integers())),
        st.tuples(st.just("guided_regex"), st.one_of(st.sampled_from(["(", "[", "*"]), surrogate_text)),
        st.tuples(st.just("guided_choice"), st.one_of(st.just([]), st.lists(surrogate_text, min_size=1, max_size=2))),
        st.tuples(st.just("guided_grammar"), st.sampled_from(["nonsense", "root ::= undefined_rule"])),
        st.tuples(st.just("guided_json"), st.sampled_from([{"type": "no-such-type"}, "{not json", 5])),
        st.tuples(st.just("response_format"), st.sampled_from([{"type": "json_schema"}, {"type": "nope"}, "text"])),
        st.tuples(st.just("cache_salt"), st.one_of(surrogate_text, st.text(min_size=257, max_size=300))),
        st.tuples(st.just("seed"), st.one_of(st.integers(min_value=2**64), NOT_NUMBERS)),
        st.tuples(st.just("logit_bias"), st.just({"1": 5.0})),
    )


def _completion_prompts():
    surrogate_text = st.builds(with_surrogate, TEXT, SURROGATES)
    return st.one_of(
        st.just(""), st.just([]), surrogate_text, st.lists(surrogate_text, min_size=1, max_size=3),
        st.lists(st.integers(min_value=VOCAB_SIZE, max_value=2**40), min_size=1, max_size=4),
        st.lists(st.integers(max_value=-1), min_size=1, max_size=4),
        st.lists(st.just("x"), min_size=65, max_size=70), st.integers(), st.none(),
    )


def _chat_messages():
    surrogate_text = st.builds(with_surrogate, TEXT, SURROGATES)
    return st.one_of(
        st.just([]), st.lists(st.fixed_dictionaries({"role": surrogate_text, "content": TEXT}), min_size=1, max_size=2),
        st.lists(st.fixed_dictionaries({"role": st.just("user"), "content": surrogate_text}), min_size=1, max_size=2),
        st.just([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]),
        st.just([{"content": "no role"}]), st.just("not a list"), st.just([5]),
    )


def check_http_answer(address: str, path: str, body: dict) -> None:
    started = time.monotonic()
    status, reply, _ = post(address, path, body)
    assert time.monotonic() - started < MAX_ANSWER_S
    assert_openai_error(status, reply)


@FUZZ
@given(broken=_broken_fields(), prompt_is_broken=st.booleans(), prompt=_completion_prompts())
def test_invalid_completions_are_4xx_in_openais_shape(stack, broken, prompt_is_broken, prompt):
    body = {"prompt": prompt if prompt_is_broken else "Hello", "max_tokens": 2}
    if not prompt_is_broken:
        body[broken[0]] = broken[1]
    check_http_answer(stack.stack.ready_info["gateway"]["http_address"], "/v1/completions", body)


@FUZZ
@given(broken=_broken_fields(), messages_are_broken=st.booleans(), messages=_chat_messages())
def test_invalid_chat_completions_are_4xx_in_openais_shape(stack, broken, messages_are_broken, messages):
    body = {"messages": messages if messages_are_broken else [{"role": "user", "content": "Hi"}], "max_tokens": 2}
    if not messages_are_broken:
        body[broken[0]] = broken[1]
    check_http_answer(stack.stack.ready_info["gateway"]["http_address"], "/v1/chat/completions", body)


@settings(FUZZ, max_examples=40)
@given(raw=st.one_of(st.binary(max_size=64), st.text(max_size=64).map(str.encode)))
def test_unparsable_http_bodies_are_4xx(stack, raw):
    try:
        is_valid_json_body = isinstance(json.loads(raw), dict)
    except (ValueError, UnicodeDecodeError):
        is_valid_json_body = False
    if is_valid_json_body:
        return  # a JSON object without a prompt is still invalid, but that is the tests above
    status, reply, _ = post(stack.stack.ready_info["gateway"]["http_address"], "/v1/completions", raw)
    assert_openai_error(status, reply)


# ---- gRPC: GenerateRequest with one broken field --------------------------------------------

def _broken_grpc_requests():
    def with_sampling(**fields):
        return gw.GenerateRequest(text="Hello", sampling=gen.SamplingParams(**{"max_tokens": 2, **fields}))

    return st.one_of(
        st.builds(lambda t: with_sampling(temperature=t), st.floats(max_value=-0.01, allow_nan=False)),
        st.builds(lambda p: with_sampling(top_p=p), st.one_of(st.floats(min_value=1.01, allow_infinity=False),
                                                              st.just(0.0), st.just(float("nan")))),
        st.builds(lambda n: with_sampling(n=n), st.one_of(st.integers(-2**31, 0), st.integers(33, 2**31 - 1))),
        st.builds(lambda m: with_sampling(max_tokens=m), st.integers(-2**31, 0)),
        st.builds(lambda k: with_sampling(logprobs=k), st.one_of(st.integers(21, 2**31 - 1), st.integers(-2**31, -1))),
        st.builds(lambda s: with_sampling(stop=s), st.lists(st.just("s"), min_size=33, max_size=40)),
        st.builds(lambda r: with_sampling(guided=gen.GuidedDecoding(regex=r)), st.sampled_from(["(", "[", "*"])),
        st.builds(lambda ids: gw.GenerateRequest(token_ids=gw.TokenIds(ids=ids)),
                  st.lists(st.integers(VOCAB_SIZE, 2**32 - 1), min_size=1, max_size=4)),
        st.builds(lambda m: gw.GenerateRequest(text="Hello", model=m), st.text(min_size=1).map(lambda t: "nope-" + t)),
        st.builds(lambda r: gw.GenerateRequest(text="Hello", request_id=r),
                  st.text(max_size=20).map(lambda r: r + "#")),
        st.just(gw.GenerateRequest()), st.just(gw.GenerateRequest(text="")),
        st.just(gw.GenerateRequest(chat=gw.ChatMessages())),
    )


@FUZZ
@given(request=_broken_grpc_requests())
def test_invalid_grpc_requests_are_invalid_argument_or_not_found(stack, request):
    started = time.monotonic()
    with pytest.raises(grpc.RpcError) as refused:
        list(stack.gateway.Generate(request, timeout=MAX_ANSWER_S))
    assert refused.value.code() in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND), (
        refused.value.code(), refused.value.details()[:300])
    assert len(refused.value.details()) <= 1024
    assert time.monotonic() - started < MAX_ANSWER_S


# ---- The ten rejections that named no field (issue 37), each with the message it gets now ----

NOT_UTF8 = "<not-utf8>"


def with_invalid_utf8(message) -> bytes:
    data = message.SerializeToString()
    return data.replace(NOT_UTF8.encode(), b"\xff" * len(NOT_UTF8))


@pytest.mark.parametrize("method, grpc_request, field", [
    ("Generate", gw.GenerateRequest(text=NOT_UTF8), "text"),
    ("Generate", gw.GenerateRequest(text="Hi", model=NOT_UTF8), "model"),
    ("Generate", gw.GenerateRequest(text="Hi", request_id=NOT_UTF8), "request_id"),
    ("Generate", gw.GenerateRequest(text="Hi", sampling=gen.SamplingParams(stop=["a", NOT_UTF8])), "sampling.stop[1]"),
    ("Generate", gw.GenerateRequest(chat=gw.ChatMessages(messages=[
        gw.ChatMessage(role="user", content=content) for content in ("a", "b", NOT_UTF8)])), "chat.messages[2].content"),
    ("Tokenize", gw.TokenizeRequest(text=NOT_UTF8), "text"),
])
def test_invalid_utf8_in_a_grpc_string_field_names_the_field(stack, method, grpc_request, field):
    channel = stack.channel(stack.stack.gateway_address)
    path, data = f"/pdserve.v1.Gateway/{method}", with_invalid_utf8(grpc_request)
    with pytest.raises(grpc.RpcError) as refused:
        if method == "Generate":
            list(channel.unary_stream(path)(data, timeout=MAX_ANSWER_S))
        else:
            channel.unary_unary(path)(data, timeout=MAX_ANSWER_S)
    assert (refused.value.code(), refused.value.details()) == (
        grpc.StatusCode.INVALID_ARGUMENT, f"{field}: not valid UTF-8 text")


@pytest.mark.parametrize("raw_fields, param, message", [
    ('"max_tokens": ' + "9" * 5000, "max_tokens", "max_tokens: integer has more than 4300 digits"),
    ('"guided_json": ' + "[" * 5000 + "]" * 5000, "guided_json", "guided_json: nested deeper than 512 levels"),
    ('"guided_json": {"not": {}}', "guided_json",
     'guided_json: no value satisfies this schema: "not": {} refuses every value'),
    ('"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"not": {}}}}',
     "response_format.json_schema.schema",
     'response_format.json_schema.schema: no value satisfies this schema: "not": {} refuses every value'),
])
def test_numbers_depths_and_schemas_past_the_limits_are_400_naming_the_field(stack, raw_fields, param, message):
    body = ('{"prompt": "Hello", ' + raw_fields + "}").encode()
    status, reply, _ = post(stack.stack.ready_info["gateway"]["http_address"], "/v1/completions", body)
    assert_openai_error(status, reply, 400, param)
    assert reply["error"]["message"] == message


def test_the_stack_still_serves_after_the_corpus(stack):
    request = gw.GenerateRequest(text="Hello", sampling=gen.SamplingParams(max_tokens=2, temperature=0))
    replies = list(stack.gateway.Generate(request, timeout=120))
    assert replies[-1].usage.completion_tokens == 2


def test_the_gateway_gives_back_what_the_corpus_left_once_idle(stack, gateway_rss_before_the_corpus):
    """Its idle heap trim (services.gateway.heap_trim, every 10 s at most) returns the memory the
    refused bodies left free in the heaps: within 50 MiB of where the corpus started."""
    pid = stack.stack.gateway.pid
    stack.wait_for(lambda: resident_bytes(pid) - gateway_rss_before_the_corpus < MAX_GATEWAY_GROWTH_BYTES, 120,
                   f"the gateway's RSS within 50 MiB of {gateway_rss_before_the_corpus >> 20} MiB")
