"""LoRA adapters served through the disaggregated stack: Redis, a gateway, one prefill and one
decode instance (real SmolLM2, float32, KV over UCX), the adapters given as `pdserve up
--lora-modules` passes them on (what `make run UP_ARGS="--lora-modules name=path"` starts).

Adapters are made with peft for SmolLM2 (random, non-zero A and B; two ranks and two sets of
target modules); the reference is peft's merged model in transformers: every generated token
must be its argmax given the same prefix (teacher forcing), unless it sees a near-tie there.
Proves: `model="<adapter>"` picks the adapter on gRPC and through the official OpenAI client,
alone and concurrently with the base model and the other adapter; the OpenAI client's greedy
text for an adapter (and the base) is the offline API's; /v1/models lists the adapters with
their parent; an unknown name gets OpenAI's 404 naming it, a configured adapter no instance
serves UNAVAILABLE naming it; no prefix is shared across adapters; an adapter loaded at run
time over HTTP is served, and gone once unloaded. After every test every instance's free-block
count is back at its total.
"""

import json
import threading
import urllib.error
import urllib.request

import grpc
import openai
import pytest

from services.cli.main import build_parser
from services.cli.up_command import config_from_args
from shared.engine import LLM, LoRARequest, SamplingParams
from shared.pb.pdserve.v1 import gateway_pb2
from shared.tokenization.tokenizer import encode_prompt, load_tokenizer
from tests.helpers.gateway_client import generate, generate_error, generate_request
from tests.helpers.lora_adapters import AdapterSpec, assert_merged_choices, merged_model, save_peft_adapter
from tests.helpers.stack import running_stack

NUM_NEW = 10
PROMPTS = ["The capital of France is", "def fibonacci(n):"]
ADAPTERS = {
    "sql": AdapterSpec(rank=8, alpha=16, target_modules=("q_proj", "v_proj"), seed=11, std=0.05),
    "chat": AdapterSpec(rank=4, alpha=8, seed=12, std=0.08,
                        target_modules=("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")),
    "late": AdapterSpec(rank=4, alpha=8, target_modules=("down_proj", "o_proj"), seed=13, std=0.05),
}


@pytest.fixture(scope="module")
def adapter_folders(smollm2_folder, tmp_path_factory):
    root = tmp_path_factory.mktemp("smollm2_adapters")
    return {name: save_peft_adapter(smollm2_folder, root / name, spec) for name, spec in ADAPTERS.items()}


@pytest.fixture(scope="module")
def prompt_ids(smollm2_folder) -> list[list[int]]:
    tokenizer = load_tokenizer(smollm2_folder)
    return [encode_prompt(tokenizer, prompt) for prompt in PROMPTS]


@pytest.fixture(scope="module")
def merged(smollm2_folder, adapter_folders) -> dict:
    """Per model name ("" for the base), the merged fp32 reference model."""
    models = {name: merged_model(smollm2_folder, folder) for name, folder in adapter_folders.items()}
    models[""] = merged_model(smollm2_folder, None)
    return models


def up_children_args(adapter_folders) -> dict[str, list[str]]:
    """The arguments `pdserve up` gives its children for `make run UP_ARGS="--lora-modules
    sql=<folder> chat=<folder> ..."` (the gateway also told of an adapter nobody serves)."""
    modules = [f"{name}={adapter_folders[name]}" for name in ("sql", "chat")]
    args = build_parser().parse_args(["up", "--lora-modules", *modules, "--instance-arg=--num-blocks",
                                      "--instance-arg=256", "--instance-arg=--max-loras", "--instance-arg=2",
                                      "--gateway-arg=--lora-modules", "--gateway-arg=nowhere"])
    return config_from_args(args).extra_args


@pytest.fixture(scope="module")
def stack(smollm2_folder, adapter_folders, tmp_path_factory):
    yield from running_stack(smollm2_folder, "float32", num_prefill=1, num_decode=1,
                             run_dir=tmp_path_factory.mktemp("lora_stack"),
                             extra_args=up_children_args(adapter_folders))


@pytest.fixture(scope="module")
def offline(smollm2_folder) -> LLM:
    """The offline API on the same model, float32 and one thread as each instance."""
    return LLM(model=str(smollm2_folder), dtype="float32", num_threads=1, num_blocks=64, enable_lora=True,
               max_loras=2, max_lora_rank=16)


@pytest.fixture(autouse=True)
def no_stranded_blocks(stack):
    stack.check_children_alive()
    yield
    stack.wait_all_blocks_free()
    stack.check_children_alive()


def greedy(stack, model: str, token_ids: list[int]):
    return generate(stack.gateway, generate_request(token_ids=token_ids, model=model, max_tokens=NUM_NEW,
                                                      ignore_eos=True))


def http_post(stack, path: str, body: dict) -> tuple[int, dict]:
    address = stack.stack.ready_info["gateway"]["http_address"]
    request = urllib.request.Request(f"http://{address}{path}", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


@pytest.mark.parametrize("model", ["sql", "chat", ""])
def test_each_model_over_grpc_follows_peft_merged(stack, merged, prompt_ids, model):
    outputs = [greedy(stack, model, token_ids).token_ids for token_ids in prompt_ids]
    for token_ids, generated in zip(prompt_ids, outputs):
        assert len(generated) == NUM_NEW
        assert_merged_choices(merged[model], token_ids, generated)
    if model:  # the adapter changed what the base model would say
        assert outputs != [greedy(stack, "", token_ids).token_ids for token_ids in prompt_ids]


def test_adapters_and_base_concurrently_follow_their_references(stack, merged, prompt_ids):
    cases = [(model, index) for model in ("sql", "", "chat") for index in range(len(prompt_ids))]
    results: dict[tuple[str, int], list[int]] = {}

    def run(model: str, index: int) -> None:
        results[(model, index)] = greedy(stack, model, prompt_ids[index]).token_ids

    threads = [threading.Thread(target=run, args=case) for case in cases]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for model, index in cases:
        assert len(results[(model, index)]) == NUM_NEW
        assert_merged_choices(merged[model], prompt_ids[index], results[(model, index)])


def test_the_openai_client_names_the_adapter_as_its_model(client, stack, prompt_ids):
    """HTTP answers as gRPC does (each computed alone from scratch: a salt of its own)."""
    completion = client.completions.create(model="sql", prompt=PROMPTS[0], max_tokens=NUM_NEW, temperature=0,
                                           extra_body={"ignore_eos": True, "cache_salt": "http"})
    request = generate_request(text=PROMPTS[0], model="sql", max_tokens=NUM_NEW, ignore_eos=True)
    request.cache_salt = "grpc"
    over_grpc = generate(stack.gateway, request)
    assert completion.model == "sql"
    assert completion.choices[0].text == over_grpc.text


@pytest.mark.parametrize("model", ["sql", "chat", ""])
def test_the_openai_client_gets_the_offline_apis_greedy_text(client, stack, offline, adapter_folders, model):
    """`model="<adapter>"` over HTTP gives what `LLM.generate(lora_request=...)` gives (fp32:
    exact; a salt of its own, so no prefix computed in another batch is reused)."""
    lora = LoRARequest(model, 1 + list(ADAPTERS).index(model), str(adapter_folders[model])) if model else None
    [expected] = offline.generate([PROMPTS[0]], SamplingParams(temperature=0, max_tokens=NUM_NEW, ignore_eos=True),
                                  lora_request=lora)
    completion = client.completions.create(model=model or stack.model_folder.name, prompt=PROMPTS[0],
                                           max_tokens=NUM_NEW, temperature=0,
                                           extra_body={"ignore_eos": True, "cache_salt": f"offline-{model}"})
    assert completion.choices[0].text == expected.text


def test_models_lists_every_adapter_with_its_parent(client, stack):
    cards = {card.id: card for card in client.models.list().data}
    base = next(card for card in cards.values() if getattr(card, "parent", None) is None)
    for name in ("sql", "chat", "nowhere"):
        assert cards[name].parent == base.id
    listed = stack.gateway.ListModels(gateway_pb2.ListModelsRequest(), timeout=30)
    assert {card.id: card.parent for card in listed.models if card.HasField("parent")} == {
        "sql": base.id, "chat": base.id, "nowhere": base.id}


def test_an_unknown_model_is_an_openai_404_naming_it(client, stack, prompt_ids):
    with pytest.raises(openai.NotFoundError) as error:
        client.completions.create(model="no-such-adapter", prompt=PROMPTS[0], max_tokens=2)
    assert error.value.status_code == 404
    assert "no-such-adapter" in error.value.body["message"]
    assert error.value.body["code"] == "model_not_found"
    rpc_error = generate_error(stack.gateway, generate_request(token_ids=prompt_ids[0], model="no-such-adapter"))
    assert rpc_error.code() == grpc.StatusCode.NOT_FOUND and "no-such-adapter" in rpc_error.details()


def test_an_adapter_no_instance_serves_is_unavailable_naming_it(stack, prompt_ids):
    error = generate_error(stack.gateway, generate_request(token_ids=prompt_ids[0], model="nowhere"))
    assert error.code() == grpc.StatusCode.UNAVAILABLE and "'nowhere'" in error.details()


def test_no_prefix_is_shared_across_adapters(stack, prompt_ids):
    token_ids = prompt_ids[1] * 8  # a few full blocks
    first = {model: greedy(stack, model, token_ids) for model in ("", "sql", "chat")}
    again = {model: greedy(stack, model, token_ids) for model in ("chat", "sql", "")}
    assert [first[model].usage.cached_prompt_tokens for model in ("sql", "chat")] == [0, 0]
    assert all(again[model].usage.cached_prompt_tokens > 0 for model in again)
    assert all(again[model].token_ids == first[model].token_ids for model in again)


def test_an_adapter_loaded_at_run_time_is_served_until_unloaded(stack, adapter_folders, merged, prompt_ids):
    status, body = http_post(stack, "/v1/load_lora_adapter", {"lora_name": "late",
                                                              "lora_path": str(adapter_folders["late"])})
    assert status == 200 and len(body["instances"]) == 2
    assert_merged_choices(merged["late"], prompt_ids[0], greedy(stack, "late", prompt_ids[0]).token_ids)
    status, body = http_post(stack, "/v1/load_lora_adapter", {"lora_name": "late",
                                                              "lora_path": str(adapter_folders["late"])})
    assert status == 400 and "already loaded" in body["error"]["message"]
    status, body = http_post(stack, "/v1/unload_lora_adapter", {"lora_name": "late"})
    assert status == 200 and len(body["instances"]) == 2
    error = generate_error(stack.gateway, generate_request(token_ids=prompt_ids[0], model="late"))
    assert error.code() == grpc.StatusCode.NOT_FOUND and "'late'" in error.details()
