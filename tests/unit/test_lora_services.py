"""LoRA in the services: the settings, the instance's adapter table, the adapters in the
registration, and how the gateway picks the adapter from `model` and the instances that
serve it (the whole path runs in tests/e2e/test_lora_serving.py)."""

import os

import grpc
import pytest

from services.instance.engine_setup import engine_config
from services.rpc.errors import ServiceError
from services.instance.flags import parse_settings
from services.instance.lora_adapters import AdapterTable
from services.instance.settings import lora_config, parse_lora_modules
from services.gateway.cluster_view import _serving_adapter, live_adapters
from services.gateway.errors import GatewayError
from services.gateway.prompt_hashes import PromptHashes
from services.gateway.request_prep import check_model
from services.gateway.served_model import ServedModel
from shared.cluster.instance_records import InstanceInfo, InstanceLoad, decode_instance, encode_instance
from shared.errors import ConfigurationError, InvalidRequestError
from shared.kv_cache.block_hash import HashRecipe
from shared.lora import LoRAConfig
from shared.pb.pdserve.v1 import instance_pb2 as pb
from tests.helpers.lora_adapters import AdapterSpec, save_peft_adapter

ROLES = ("decode", "colocated")


@pytest.fixture(autouse=True)
def no_pdserve_variables(monkeypatch):
    for name in [name for name in os.environ if name.startswith("PDSERVE_")]:
        monkeypatch.delenv(name)


@pytest.fixture(scope="module")
def adapter_folder(tiny_llama_folder, tmp_path_factory):
    spec = AdapterSpec(rank=8, alpha=16, target_modules=("q_proj", "v_proj"), seed=1)
    return save_peft_adapter(tiny_llama_folder, tmp_path_factory.mktemp("adapter") / "sql", spec)


def test_lora_modules_take_several_values_per_flag_a_repeated_flag_or_a_variable(monkeypatch):
    assert not engine_config(parse_settings("x", ROLES, [])).lora.enable_lora
    assert engine_config(parse_settings("x", ROLES, ["--enable-lora"])).lora.enable_lora
    settings = parse_settings("x", ROLES, ["--lora-modules", "a=/x", "b=/y", "--lora-modules", "c=/z"])
    assert settings.lora_modules == ("a=/x", "b=/y", "c=/z")
    assert engine_config(settings).lora == LoRAConfig(enable_lora=True, max_loras=4, max_lora_rank=16)
    monkeypatch.setenv("PDSERVE_LORA_MODULES", "a=/x, b=/y")
    monkeypatch.setenv("PDSERVE_MAX_LORAS", "2")
    settings = parse_settings("x", ROLES, [])
    assert parse_lora_modules(settings.lora_modules) == {"a": "/x", "b": "/y"}
    assert lora_config(settings).max_loras == 2


@pytest.mark.parametrize("modules, words", [(("a",), "not name=path"), (("a=/x", "a=/y"), "given twice"),
                                            (("bad name=/x",), "must be 1-128 characters")])
def test_bad_lora_modules_are_refused_naming_the_setting(modules, words):
    with pytest.raises(ConfigurationError, match=words) as error:
        parse_lora_modules(modules)
    assert error.value.field == "lora_modules"


def test_the_adapter_table_serves_names_and_refuses_what_it_cannot(adapter_folder, tmp_path):
    table = AdapterTable(LoRAConfig(enable_lora=True, max_lora_rank=8))
    key = table.load("sql", str(adapter_folder))
    assert key.startswith("lora:sql:") and table.registered() == {"sql": key}
    with pytest.raises(InvalidRequestError, match="already loaded"):
        table.load("sql", str(adapter_folder))
    with pytest.raises(InvalidRequestError, match="adapter_config.json") as error:
        table.load("empty", str(tmp_path))
    assert error.value.field == "lora_path"
    with pytest.raises(InvalidRequestError, match="rank 8, above max_lora_rank=4"):
        AdapterTable(LoRAConfig(enable_lora=True, max_lora_rank=4)).load("sql", str(adapter_folder))
    with pytest.raises(InvalidRequestError, match="serves no LoRA adapters"):
        AdapterTable(LoRAConfig()).load("sql", str(adapter_folder))


def test_requests_name_a_served_adapter_with_its_key(adapter_folder):
    table = AdapterTable(LoRAConfig(enable_lora=True))
    key = table.load("sql", str(adapter_folder))
    assert table.resolve(pb.ReserveRequest()) is None
    lora_request = table.resolve(pb.ReserveRequest(lora_adapter=pb.LoRAAdapterRef(name="sql", key=key)))
    assert (lora_request.lora_name, lora_request.lora_int_id) == ("sql", 1)
    with pytest.raises(ServiceError, match="'chat' is not served here") as error:
        table.resolve(pb.PrefillRequest(lora_adapter=pb.LoRAAdapterRef(name="chat", key=key)))
    assert error.value.code == grpc.StatusCode.NOT_FOUND
    with pytest.raises(ServiceError, match="other files") as error:
        table.resolve(pb.PrefillRequest(lora_adapter=pb.LoRAAdapterRef(name="sql", key="lora:sql:other")))
    assert error.value.code == grpc.StatusCode.FAILED_PRECONDITION


def test_an_adapter_loaded_again_gets_a_new_id(adapter_folder):
    table = AdapterTable(LoRAConfig(enable_lora=True))
    table.load("sql", str(adapter_folder))
    table.unload("sql")
    with pytest.raises(ServiceError, match="not loaded") as error:
        table.unload("sql")
    assert error.value.code == grpc.StatusCode.NOT_FOUND
    table.load("sql", str(adapter_folder))
    assert table.resolve(pb.ReserveRequest(lora_adapter=pb.LoRAAdapterRef(name="sql"))).lora_int_id == 2


def info(instance_id: str, adapters: dict[str, str]) -> InstanceInfo:
    return InstanceInfo(instance_id, "decode", "127.0.0.1:1", "", "tiny", lora_adapters=tuple(sorted(adapters.items())))


def test_registered_adapters_round_trip_and_older_records_have_none():
    record = info("d1", {"sql": "lora:sql:aa", "chat": "lora:chat:bb"})
    assert decode_instance(encode_instance(record, InstanceLoad())) == (record, InstanceLoad())
    older = {name: value for name, value in encode_instance(record, InstanceLoad()).items() if name != "lora_adapters"}
    assert decode_instance(older)[0].lora_adapters == ()


def test_the_gateway_routes_an_adapter_only_to_instances_with_its_most_registered_key():
    listing = [(info("d1", {"sql": "lora:sql:aa"}), InstanceLoad()), (info("d2", {}), InstanceLoad()),
               (info("d3", {"sql": "lora:sql:aa", "chat": "lora:chat:cc"}), InstanceLoad()),
               (info("d4", {"sql": "lora:sql:zz"}), InstanceLoad())]
    prompt = PromptHashes(list(range(40)), None, adapter="sql")
    assert [record.instance_id for record, _ in _serving_adapter(listing, prompt)] == ["d1", "d3"]
    assert prompt.adapter_key == "lora:sql:aa"
    assert _serving_adapter(listing, PromptHashes([1, 2], None, adapter="nowhere")) == []
    assert live_adapters(listing) == {"sql", "chat"}


def test_an_adapter_prompt_hashes_apart_from_the_base_prompt():
    recipe = HashRecipe("tiny", 4)
    base = PromptHashes(list(range(40)), None)
    adapted = PromptHashes(list(range(40)), None, adapter="sql")
    adapted.adapter_key = "lora:sql:aa"
    assert not set(base.for_recipe(recipe)) & set(adapted.for_recipe(recipe))


def test_model_names_the_base_an_adapter_or_nothing_served():
    model = ServedModel(name="tiny", model_key="tiny", tokenizer=None, vocab_size=256, max_model_len=128)
    assert check_model("", model, adapters=["sql"]) is None
    assert check_model("tiny", model, adapters=["sql"]) is None
    assert check_model("sql", model, adapters=["sql"]) == "sql"
    with pytest.raises(GatewayError, match="'chat' is not served here.*'sql'") as error:
        check_model("chat", model, adapters=["sql"])
    assert error.value.code == grpc.StatusCode.NOT_FOUND
