"""The instance entry points as real processes: `python -m services.prefill` and
`python -m services.decode --role colocated`, configured by flags and PDSERVE_* variables,
announce themselves through --ready-file, serve a disaggregated request between them over
UCX, and shut down cleanly on SIGTERM (exit 0, deregistered, prefix index dropped)."""

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from shared.cluster.instances import InstanceRegistry
from shared.cluster.keys import ClusterNamespace
from shared.cluster.prefix_index import PrefixIndex
from shared.engine import LLM, SamplingParams
from shared.pb.pdserve.v1 import generation_pb2 as gen_pb
from shared.pb.pdserve.v1 import instance_pb2 as pb
from shared.pb.pdserve.v1.instance_pb2_grpc import InstanceStub
from tests.helpers.redis_server import connect_async

REPO_ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 120.0
DEPLOYMENT = "proc"


def spawn(module: str, args: list[str], env_settings: dict[str, str], log_path: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), **env_settings}
    with open(log_path, "w") as log:
        return subprocess.Popen([sys.executable, "-m", module, *args], cwd=REPO_ROOT, env=env,
                                stdout=log, stderr=subprocess.STDOUT)


def wait_for_ready_file(path: Path, process: subprocess.Popen, log_path: Path) -> dict:
    deadline = time.monotonic() + START_TIMEOUT_S
    while not path.exists():
        assert process.poll() is None, f"{process.args} exited early:\n{log_path.read_text()}"
        assert time.monotonic() < deadline, f"{path} never appeared:\n{log_path.read_text()}"
        time.sleep(0.1)
    return json.loads(path.read_text())


def stop(process: subprocess.Popen) -> int:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    try:
        return process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        return -9


@pytest.fixture
def processes(tmp_path, tiny_llama_folder, redis_server):
    common = ["--model", str(tiny_llama_folder), "--dtype", "float32", "--grpc-port", "0",
              "--redis-url", redis_server.url, "--num-threads", "1", "--log-level", "INFO",
              "--heartbeat-interval-s", "0.2", "--heartbeat-ttl-s", "2"]
    started = {}
    for name, module, extra, env in (
        ("prefill", "services.prefill", ["--num-blocks", "32"], {"PDSERVE_DEPLOYMENT": DEPLOYMENT}),
        ("colocated", "services.decode", ["--role", "colocated", "--deployment", DEPLOYMENT],
         {"PDSERVE_NUM_BLOCKS": "24", "PDSERVE_DEPLOYMENT": "overridden-by-the-flag"}),
    ):
        ready = tmp_path / f"{name}.json"
        log_path = tmp_path / f"{name}.log"
        started[name] = (spawn(module, [*common, *extra, "--ready-file", str(ready)], env, log_path), ready, log_path)
    try:
        yield {name: (process, wait_for_ready_file(ready, process, log_path), log_path)
               for name, (process, ready, log_path) in started.items()}
    finally:
        for process, _, _ in started.values():
            stop(process)


def test_prefill_and_colocated_processes_serve_then_stop_cleanly(processes, tiny_llama_folder, redis_server):
    prompt = [3 + (i * 37) % 250 for i in range(40)]
    sampling = gen_pb.SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    (prefill, prefill_ready, prefill_log), (colocated, colocated_ready, colocated_log) = (processes["prefill"],
                                                                                         processes["colocated"])
    assert prefill_ready["role"] == "prefill" and prefill_ready["ucx_address"]  # peer reuse: it receives pulls
    assert colocated_ready["role"] == "colocated" and colocated_ready["ucx_address"]

    async def serve_one_request() -> list[int]:
        async with grpc.aio.insecure_channel(prefill_ready["grpc_address"]) as to_prefill, \
                grpc.aio.insecure_channel(colocated_ready["grpc_address"]) as to_colocated:
            for channel in (to_prefill, to_colocated):
                reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
                assert reply.status == health_pb2.HealthCheckResponse.SERVING
            decode = InstanceStub(to_colocated)
            reserved = await decode.Reserve(pb.ReserveRequest(request_id="p1", prompt_token_ids=prompt,
                                                              sampling=sampling), timeout=10)
            prefilled = await InstanceStub(to_prefill).Prefill(pb.PrefillRequest(
                request_id="p1", prompt_token_ids=prompt, sampling=sampling, decode_ucx_address=reserved.ucx_address,
                dst_block_ids=reserved.block_ids, transfer_token=reserved.transfer_token), timeout=10)
            messages = [m async for m in decode.Decode(pb.DecodeRequest(request_id="p1",
                                                                        first_token_id=prefilled.first_token_id),
                                                       timeout=10)]
            status = await decode.GetStatus(pb.StatusRequest(), timeout=5)
            assert (status.num_total_blocks, status.num_free_blocks) == (24, 24)  # PDSERVE_NUM_BLOCKS
            assert status.kv_bytes_transferred == prefilled.kv_bytes_sent > 0
            return [token for message in messages for token in message.token_ids]

    async def registered_roles(expect_both: bool) -> list[str]:
        client = connect_async(redis_server.url)
        namespace = ClusterNamespace(DEPLOYMENT, tiny_llama_folder.name)
        deadline = time.monotonic() + START_TIMEOUT_S  # registration under a busy machine
        while True:
            roles = sorted(info.role for info, _ in await InstanceRegistry(client, namespace).list_live())
            if (len(roles) == 2) == expect_both or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.1)
        indexed = await PrefixIndex(client, namespace).indexed_instance_ids()
        await client.aclose()
        return roles, indexed

    assert asyncio.run(registered_roles(True))[0] == ["colocated", "prefill"]
    tokens = asyncio.run(serve_one_request())
    offline = LLM(model=str(tiny_llama_folder), dtype="float32", num_blocks=32, num_threads=1)
    [expected] = offline.generate([prompt], SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True))
    assert tokens == expected.token_ids
    assert (stop(prefill), stop(colocated)) == (0, 0), colocated_log.read_text()[-3000:]
    for log_path in (prefill_log, colocated_log):  # exited without teardown, after its shutdown had run
        assert re.search(r"(prefill|colocated) \S+ stopped\n", log_path.read_text()), log_path.read_text()[-3000:]
    assert asyncio.run(registered_roles(False)) == ([], set())
