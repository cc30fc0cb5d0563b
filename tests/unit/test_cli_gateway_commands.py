"""`pdserve generate` against an in-process gateway (fake instances), and `pdserve status`
against a real Redis holding registrations and a mirrored lease."""

import asyncio
import json

import grpc

from services.cli.main import build_parser
from shared.cluster.instances import DRAINING, InstanceInfo, InstanceLoad, InstanceRegistry
from shared.cluster.keys import ClusterNamespace
from shared.cluster.lease_mirror import LeaseMirror
from shared.cluster.leases import LeaseTable
from shared.cluster.versions import KV_PROTOCOL_VERSION, PDSERVE_VERSION
from tests.helpers.redis_server import connect_async
from tests.unit.conftest_tokenizer import smollm2_tokenizer  # noqa: F401 - fixture
from tests.unit.gateway_fakes import Behaviour, FakeInstance, fake_cache_settings
from tests.unit.test_gateway_service import gateway, model  # noqa: F401 - fixture


def test_generate_streams_text_to_stdout(redis_server, model, capsys):  # noqa: F811
    async def scenario():
        async with gateway(redis_server.url, model) as gate:
            await gate.add(FakeInstance("p0", "prefill"), FakeInstance("d0", "decode"))
            args = build_parser().parse_args(
                ["generate", "Say hi", "--max-tokens", "3", "--seed", "1", "--gateway", gate.server.address])
            assert await asyncio.to_thread(args.run, args) == 0
            prefill = gate.fakes[0].requests_of("StreamPrefill")[0]
            assert (prefill.sampling.max_tokens, prefill.sampling.seed, prefill.sampling.temperature) == (3, 1, 0.0)
    asyncio.run(scenario())
    captured = capsys.readouterr()
    assert captured.out == "Hello world!\n"
    assert "3 tokens, finish: stop" in captured.err


def test_generate_reports_grpc_errors(redis_server, model, capsys):  # noqa: F811
    async def scenario():
        async with gateway(redis_server.url, model, max_room_wait_s=0) as gate:
            full = Behaviour(reserve_error=grpc.StatusCode.RESOURCE_EXHAUSTED)
            await gate.add(FakeInstance("p0", "prefill"), FakeInstance("d0", "decode", full))
            args = build_parser().parse_args(["generate", "--chat", "Hi", "--gateway", gate.server.address])
            return await asyncio.to_thread(args.run, args)
    assert asyncio.run(scenario()) == 1
    assert "RESOURCE_EXHAUSTED" in capsys.readouterr().err


def test_status_lists_serving_and_draining_instances_and_leases(redis_server, capsys):
    namespace = ClusterNamespace("prod", "m1")

    async def setup():
        client = connect_async(redis_server.url)
        registry = InstanceRegistry(client, namespace)
        await registry.register(InstanceInfo("d0", "decode", "127.0.0.1:7001", "127.0.0.1:9001", "m1",
                                             cache=fake_cache_settings("m1")), InstanceLoad(2, 3, 40, 64))
        await registry.register(InstanceInfo("p0", "prefill", "127.0.0.1:7002", "", "m1", state=DRAINING),
                                InstanceLoad(1, 0, 64, 64))  # finishing its work after a SIGTERM
        mirror = LeaseMirror(client, namespace)
        LeaseTable("d0", mirror=mirror).grant("req-9", [4, 5, 6], ttl_s=30)
        await mirror.flush()
        await mirror.close()
        await client.aclose()

    asyncio.run(setup())
    base = ["status", "--redis-url", redis_server.url, "--deployment", "prod", "--model", "m1"]
    args = build_parser().parse_args(base)
    assert args.run(args) == 0
    table = capsys.readouterr().out
    assert "2 live instances (1 draining)" in table and "1 block leases" in table
    rows = [line.split() for line in table.splitlines()]
    version = f"{PDSERVE_VERSION}/kv{KV_PROTOCOL_VERSION}"  # pdserve and KV wire protocol versions
    assert ["d0", "decode", "serving", "127.0.0.1:7001", "127.0.0.1:9001", "2", "3", "40/64",
            "16/sha256/bfloat16/tp1", version, "-"] in rows  # "-": no KV-event endpoint
    assert ["p0", "prefill", "draining", "127.0.0.1:7002", "-", "1", "0", "64/64", "-", version, "-"] in rows
    assert "req-9" in table
    args = build_parser().parse_args(base + ["--json"])
    assert args.run(args) == 0
    status = json.loads(capsys.readouterr().out)
    assert [i["instance_id"] for i in status["instances"]] == ["d0", "p0"]
    assert status["instances"][0]["cache"]["block_size"] == 16 and status["instances"][1]["cache"] is None
    assert status["instances"][0]["kv_protocol_version"] == KV_PROTOCOL_VERSION
    assert [i["state"] for i in status["instances"]] == ["serving", "draining"]
    assert status["leases"][0]["block_ids"] == [4, 5, 6]


def test_status_reports_an_unreachable_redis(capsys):
    args = build_parser().parse_args(["status", "--redis-url", "redis://127.0.0.1:1/0", "--model", "m1"])
    assert args.run(args) == 1
    assert "cannot read" in capsys.readouterr().err
