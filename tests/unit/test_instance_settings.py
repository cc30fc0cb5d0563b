"""Instance settings: every flag also a PDSERVE_* variable, validation naming the setting,
the role flag of each entry point; plus the small pure parts (ready file, prefix-index deltas)."""

import json
import os
import socket

import pytest

import services.decode
import services.prefill
from services.instance.engine_setup import engine_config
from services.instance.flags import build_parser, env_name, flag_name, parse_settings
from shared.engine.introspection import kv_cache_events
from services.launcher.readiness import registered_namespace
from services.rpc.ready_file import write_ready_file
from services.instance.settings import DEFAULT_GRPC_PORTS, InstanceSettings
from shared.kv_cache.block_pool import BlockPool
from shared.cluster.keys import ClusterNamespace
from shared.errors import ConfigurationError

DECODE_ROLES = ("decode", "colocated")


@pytest.fixture(autouse=True)
def no_pdserve_variables(monkeypatch):
    for name in [name for name in os.environ if name.startswith("PDSERVE_")]:
        monkeypatch.delenv(name)


def test_every_setting_is_a_flag_and_an_environment_variable():
    help_text = build_parser("x", DECODE_ROLES).format_help()
    for name in InstanceSettings.setting_fields():
        assert flag_name(name) in help_text
        assert env_name(name) in help_text
    assert env_name("kv_cache_memory_gb") == "PDSERVE_KV_CACHE_MEMORY_GB"


def test_environment_gives_defaults_and_flags_override_them(monkeypatch):
    environ = {"PDSERVE_NUM_BLOCKS": "12", "PDSERVE_ROLE": "colocated", "PDSERVE_DTYPE": "float32",
               "PDSERVE_HEARTBEAT_TTL_S": "3.5", "PDSERVE_DEPLOYMENT": "blue"}
    assert parse_settings("x", DECODE_ROLES, []) == InstanceSettings(role="decode")
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    settings = parse_settings("x", DECODE_ROLES, [])
    assert (settings.engine.num_blocks, settings.role, settings.engine.dtype, settings.heartbeat_ttl_s) == (12, "colocated", "float32", 3.5)
    settings = parse_settings("x", DECODE_ROLES, ["--num-blocks", "7", "--role", "decode", "--deployment", "green"])
    assert (settings.engine.num_blocks, settings.role, settings.deployment) == (7, "decode", "green")


def test_switches_take_a_flag_its_negation_or_a_yes_no_variable(monkeypatch):
    assert not parse_settings("x", DECODE_ROLES, []).engine.deterministic
    assert parse_settings("x", DECODE_ROLES, ["--deterministic"]).engine.deterministic
    assert engine_config(parse_settings("x", DECODE_ROLES, ["--deterministic"])).deterministic
    monkeypatch.setenv("PDSERVE_DETERMINISTIC", "true")
    assert parse_settings("x", DECODE_ROLES, []).engine.deterministic
    monkeypatch.setenv("PDSERVE_DETERMINISTIC", "1")
    assert not parse_settings("x", DECODE_ROLES, ["--no-deterministic"]).engine.deterministic


@pytest.mark.parametrize("argv, environ, message", [
    ([], {"PDSERVE_NUM_BLOCKS": "many"}, "--num-blocks: Input should be a valid integer"),
    ([], {"PDSERVE_DETERMINISTIC": "maybe"}, "--deterministic: Input should be a valid boolean"),
    (["--heartbeat-interval-s", "2", "--heartbeat-ttl-s", "1"], {}, "--heartbeat-ttl-s: must exceed"),
    (["--dtype", "int8"], {}, "argument --dtype: invalid choice: 'int8'"),
    (["--grpc-port", "70000"], {}, "--grpc-port: Input should be less than or equal to 65535"),
    (["--deployment", "a:b"], {}, "--deployment: must be"),
    (["--lease-ms", "0"], {}, "--lease-ms: Input should be greater than 0"),
    (["--prefix-hash-algo", "md5"], {}, "argument --prefix-hash-algo: invalid choice: 'md5'"),
    (["--engine-core", "fork"], {}, "argument --engine-core: invalid choice: 'fork'"),
    (["--max-engine-restarts", "-1"], {}, "--max-engine-restarts: Input should be greater than or equal to 0"),
    (["--role", "prefill"], {}, "invalid choice: 'prefill'"),
    ([], {"PDSERVE_ROLE": "prefill"}, "--role: must be one of decode, colocated here, got 'prefill'"),
])
def test_bad_settings_exit_2_naming_the_setting(argv, environ, message, capsys, monkeypatch):
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(SystemExit) as exited:
        parse_settings("x", DECODE_ROLES, argv)
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


def test_entry_points_offer_their_roles_and_return_exit_codes(capsys):
    assert services.prefill.main(["--help"]) == 0
    assert "--role" not in capsys.readouterr().out
    assert services.prefill.main(["--role", "decode"]) == 2
    assert services.decode.main(["--help"]) == 0
    assert "{decode,colocated}" in capsys.readouterr().out
    assert services.decode.main(["--num-blocks", "-1"]) == 2
    assert "--num-blocks: Input should be greater than or equal to 0" in capsys.readouterr().err


def test_an_instance_that_cannot_bind_its_port_exits_2(redis_server):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert services.decode.main(["--grpc-port", str(port), "--redis-url", redis_server.url]) == 2


def test_grpc_port_defaults_by_role_and_zero_means_ephemeral():
    assert {role: InstanceSettings(role=role).bound_grpc_port for role in DEFAULT_GRPC_PORTS} == DEFAULT_GRPC_PORTS
    assert InstanceSettings(role="decode", grpc_port=0).bound_grpc_port == 0


def test_engine_config_follows_the_settings():
    config = engine_config(InstanceSettings(model="m", dtype="float32", kv_cache_memory_gb=0.5, num_threads=2,
                                            max_num_seqs=3, max_num_batched_tokens=64, block_size=8))
    assert (config.model, config.dtype, config.num_threads, config.max_model_len) == ("m", "float32", 2, None)
    assert (config.cache.kv_cache_memory_bytes, config.cache.num_blocks, config.cache.block_size) == (1 << 29, None, 8)
    assert (config.scheduler.max_num_seqs, config.scheduler.max_num_batched_tokens) == (3, 64)
    config = engine_config(InstanceSettings(num_blocks=9))
    assert (config.model, config.cache.num_blocks) == (None, 9)


def test_ready_file_is_the_json_a_launcher_reads(tmp_path):
    path = tmp_path / "sub" / "ready.json"
    write_ready_file(str(path), "127.0.0.1:5", "127.0.0.1:6", "decode-1", "decode")
    assert json.loads(path.read_text()) == {"grpc_address": "127.0.0.1:5", "ucx_address": "127.0.0.1:6",
                                            "instance_id": "decode-1", "role": "decode", "metrics_address": "",
                                            "openai_address": ""}
    assert [p.name for p in path.parent.iterdir()] == ["ready.json"]


def test_the_ready_file_names_the_redis_namespace_the_instance_registers_in(tmp_path):
    path = tmp_path / "ready.json"
    write_ready_file(str(path), "127.0.0.1:5", "", "decode-1", "decode", registered_in=ClusterNamespace("prod", "m"))
    ready = json.loads(path.read_text())
    assert (ready["deployment"], ready["model"]) == ("prod", "m")
    assert registered_namespace(ready) == ClusterNamespace("prod", "m")


def _cache(pool: BlockPool, block_id: int, block_hash: bytes) -> None:
    pool.cache(pool.blocks[block_id], block_hash, (block_id,))


def net_changes(pool: BlockPool) -> tuple[list[bytes], list[bytes]]:
    events = kv_cache_events(pool)
    return list(events.stored), list(events.removed)


def snapshot(pool: BlockPool) -> list[bytes]:
    events = kv_cache_events(pool, snapshot=True)
    assert events.is_snapshot
    return list(events.stored)


def test_prefix_index_deltas_net_out_and_a_snapshot_consumes_them():
    pool = BlockPool(4)
    a, b, c = (bytes([n]) * 32 for n in (1, 2, 3))
    blocks = pool.allocate(4)
    _cache(pool, 0, a)
    _cache(pool, 1, b)
    assert net_changes(pool) == (sorted([a, b]), [])
    pool.free(blocks)
    pool.allocate(1)  # reuses block 0: evicts a
    _cache(pool, 2, c)
    assert net_changes(pool) == ([c], [a])
    pool.reset_prefix_cache()  # evicts b and c
    _cache(pool, 3, c)  # c evicted, then stored again: it stays
    assert net_changes(pool) == ([c], [b])
    _cache(pool, 1, a)
    assert snapshot(pool) == [c, a] and net_changes(pool) == ([], [])


def test_guided_limits_are_instance_flags():
    settings = parse_settings("pdserve serve decode", ["decode"], [
        "--max-grammar-bytes", "100", "--max-grammar-nesting-depth", "5", "--grammar-compile-timeout-s", "2.5",
        "--grammar-cache-size", "7"])
    limits = engine_config(settings).guided
    assert (limits.max_bytes, limits.max_nesting_depth, limits.compile_timeout_s, limits.max_cached_grammars) == (
        100, 5, 2.5, 7)


def test_the_prompt_chunk_per_step_is_small_on_decode_instances_by_default():
    # A decode instance computes local prefills (conditional disaggregation) in the steps of
    # its running decodes: their chunks stay small unless told otherwise.
    def threshold(**values):
        return engine_config(InstanceSettings(**values)).scheduler.long_prefill_token_threshold
    assert (threshold(role="decode"), threshold(role="prefill"), threshold(role="colocated")) == (64, 0, 0)
    assert threshold(role="decode", max_prefill_chunk_tokens=0) == 0
    assert threshold(role="prefill", max_prefill_chunk_tokens=128) == 128
    assert InstanceSettings().max_local_prefill_tokens == 256
    with pytest.raises(ConfigurationError, match="^max_prefill_chunk_tokens"):
        InstanceSettings(max_prefill_chunk_tokens=-2)


def test_the_openai_port_is_off_by_default_and_a_decode_or_colocated_setting(capsys, monkeypatch):
    assert parse_settings("x", DECODE_ROLES, []).openai_port == -1
    monkeypatch.setenv("PDSERVE_OPENAI_PORT", "8000")
    assert parse_settings("x", DECODE_ROLES, []).openai_port == 8000
    assert parse_settings("x", DECODE_ROLES, ["--role", "colocated", "--openai-port", "0"]).openai_port == 0
    with pytest.raises(SystemExit):
        parse_settings("x", ("prefill",), [])
    assert "--openai-port: a prefill instance serves no OpenAI API" in capsys.readouterr().err
