"""Gateway request preparation: validation (status code + the field named), tokenization,
block hashes equal to the engines', and the n > 1 split."""

import grpc
import pytest

from services.gateway.errors import GatewayError
from services.gateway.request_prep import prepare_request, split_request, tokenize_request
from services.gateway.served_model import ServedModel
from shared.core.request import Request
from shared.kv_cache.block_hash import HashRecipe
from shared.kv_cache.block_pool import BlockPool
from shared.core.kv_cache_manager import KVCacheManager
from shared.sampling.params import SamplingParams
from shared.pb.pdserve.v1 import gateway_pb2 as gw
from shared.pb.pdserve.v1 import generation_pb2 as gen
from shared.tokenization import apply_chat_template, encode_prompt
from tests.unit.conftest_tokenizer import smollm2_tokenizer  # noqa: F401 - fixture

MODEL_KEY = "SmolLM2-135M-Instruct.Q4_1-test"
VOCAB_SIZE = 49152


@pytest.fixture
def model(smollm2_tokenizer):  # noqa: F811
    return ServedModel(name="smollm2", model_key=MODEL_KEY, tokenizer=smollm2_tokenizer,
                       vocab_size=VOCAB_SIZE, max_model_len=64,
                       aliases=frozenset({"SmolLM2-135M-Instruct"}))


def request(**kwargs) -> gw.GenerateRequest:
    sampling = kwargs.pop("sampling", {})
    if not {"text", "token_ids", "chat"} & kwargs.keys():
        kwargs["text"] = "Hello there, how are you?"
    return gw.GenerateRequest(sampling=gen.SamplingParams(**sampling), **kwargs)


def rejection(message, model) -> GatewayError:
    with pytest.raises(GatewayError) as caught:
        prepare_request(message, model)
    return caught.value


@pytest.mark.parametrize("sampling, field", [
    ({"temperature": -1.0}, "temperature"),
    ({"top_p": 0.0}, "top_p"),
    ({"top_p": 1.5}, "top_p"),
    ({"top_k": -5}, "top_k"),
    ({"min_p": 2.0}, "min_p"),
    ({"repetition_penalty": 0.0}, "repetition_penalty"),
    ({"presence_penalty": 9.0}, "presence_penalty"),
    ({"n": 0}, "n"),
    ({"n": 1000}, "n"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"min_tokens": -1}, "min_tokens"),
    ({"logprobs": 500}, "logprobs"),
    ({"prompt_logprobs": -3}, "prompt_logprobs"),
    ({"stop_token_ids": [VOCAB_SIZE + 7]}, "stop_token_ids"),
])
def test_bad_sampling_field_is_invalid_argument_naming_it(model, sampling, field):
    error = rejection(request(sampling=sampling), model)
    assert error.code == grpc.StatusCode.INVALID_ARGUMENT
    assert error.message.startswith(f"{field}:"), error.message


@pytest.mark.parametrize("kwargs, field", [
    ({"text": ""}, "text"),
    ({"token_ids": gw.TokenIds(ids=[])}, "token_ids"),
    ({"token_ids": gw.TokenIds(ids=[5, VOCAB_SIZE])}, "token_ids"),
    ({"token_ids": gw.TokenIds(ids=list(range(64)))}, "token_ids"),
    ({"text": "word " * 80}, "text"),
    ({"chat": gw.ChatMessages()}, "chat.messages"),
    ({"chat": gw.ChatMessages(messages=[gw.ChatMessage(role="wizard", content="hi")])}, "chat.messages"),
    ({"request_id": "has space"}, "request_id"),
    ({"request_id": "fan#out"}, "request_id"),
    ({"request_id": "x" * 129}, "request_id"),
    ({"cache_salt": "s" * 300}, "cache_salt"),
])
def test_bad_prompt_or_ids_are_invalid_argument_naming_the_field(model, kwargs, field):
    error = rejection(request(**kwargs), model)
    assert error.code == grpc.StatusCode.INVALID_ARGUMENT
    assert error.message.startswith(f"{field}:"), error.message


def test_missing_prompt_is_invalid_argument(model):
    error = rejection(gw.GenerateRequest(), model)
    assert (error.code, error.message.split(":")[0]) == (grpc.StatusCode.INVALID_ARGUMENT, "prompt")


def test_unknown_model_is_not_found_and_known_names_pass(model):
    error = rejection(request(model="gpt-17"), model)
    assert error.code == grpc.StatusCode.NOT_FOUND
    assert "gpt-17" in error.message and "smollm2" in error.message
    for name in ("", "smollm2", "SmolLM2-135M-Instruct"):
        assert prepare_request(request(model=name), model).prompt_token_ids


def test_text_prompt_is_tokenized_and_hashed_like_the_engine(model, smollm2_tokenizer):  # noqa: F811
    text = "The quick brown fox jumps over the lazy dog. " * 4
    prepared = prepare_request(request(text=text, request_id="r-1"), model)
    ids = encode_prompt(smollm2_tokenizer, text)
    assert prepared.request_id == "r-1"
    assert prepared.prompt_token_ids == ids
    assert len(ids) >= 32
    salted = prepare_request(request(text=text, cache_salt="tenant-a"), model)
    for recipe in (HashRecipe(MODEL_KEY, 16), HashRecipe(MODEL_KEY, 8, "blake2b"), HashRecipe("other", 16)):
        assert prepared.hashes.for_recipe(recipe) == engine_block_hashes(ids, recipe)
        assert len(prepared.hashes.for_recipe(recipe)) == len(ids) // recipe.block_size
        assert salted.hashes.for_recipe(recipe) == engine_block_hashes(ids, recipe, "tenant-a")
        assert salted.hashes.for_recipe(recipe)[0] != prepared.hashes.for_recipe(recipe)[0]
    assert prepared.hashes.for_recipe(HashRecipe(MODEL_KEY, 16, "blake2b"))[0] != \
        prepared.hashes.for_recipe(HashRecipe(MODEL_KEY, 16))[0]


def engine_block_hashes(token_ids: list[int], recipe: HashRecipe, cache_salt: str | None = None) -> list[bytes]:
    """The hashes an engine built with `recipe` gives the prompt (its KV cache manager's)."""
    manager = KVCacheManager(BlockPool(4), recipe.block_size, True, recipe.algo, recipe.model_id)
    engine_request = Request("r", token_ids, SamplingParams(), cache_salt=cache_salt)
    manager.update_block_hashes(engine_request)
    return engine_request.block_hashes


def test_token_ids_and_chat_prompts(model, smollm2_tokenizer):  # noqa: F811
    prepared = prepare_request(request(token_ids=gw.TokenIds(ids=[1, 2, 3])), model)
    assert prepared.prompt_token_ids == [1, 2, 3]
    assert prepared.hashes.for_recipe(HashRecipe(MODEL_KEY, 16)) == []
    assert prepared.request_id.startswith("req-")
    chat = gw.ChatMessages(messages=[gw.ChatMessage(role="user", content="Hi!")])
    prepared = prepare_request(request(chat=chat), model)
    assert prepared.prompt_token_ids == apply_chat_template(smollm2_tokenizer, [{"role": "user", "content": "Hi!"}])


def test_unset_max_tokens_means_up_to_the_model_length(model):
    assert prepare_request(request(), model).params.max_tokens is None
    assert prepare_request(request(sampling={"max_tokens": 5}), model).params.max_tokens == 5


def test_split_request_names_and_seeds_sub_requests(model):
    prepared = prepare_request(request(request_id="r", sampling={"n": 3, "seed": 10}), model)
    subs = split_request(prepared)
    assert [(s.request_id, s.index, s.params.n, s.params.seed) for s in subs] == [
        ("r#0", 0, 1, 10), ("r#1", 1, 1, 11), ("r#2", 2, 1, 12)]
    single = split_request(prepare_request(request(request_id="s"), model))
    assert [(s.request_id, s.index) for s in single] == [("s", 0)]


def test_tokenize_request(model, smollm2_tokenizer):  # noqa: F811
    ids = tokenize_request(gw.TokenizeRequest(text="Hello world"), model)
    assert ids == encode_prompt(smollm2_tokenizer, "Hello world")
    with pytest.raises(GatewayError) as caught:
        tokenize_request(gw.TokenizeRequest(model="other", text="x"), model)
    assert caught.value.code == grpc.StatusCode.NOT_FOUND
    with pytest.raises(GatewayError) as caught:
        tokenize_request(gw.TokenizeRequest(), model)
    assert caught.value.code == grpc.StatusCode.INVALID_ARGUMENT
