"""The container health probe (`python -m services.rpc.health_probe`): given an address it asks
that one; without, it reads the port from the service's ready file and asks 127.0.0.1, so a
service on an ephemeral port (host networking, PDSERVE_GRPC_PORT=0) is probed too."""

import asyncio
import json
import subprocess
import sys

import pytest

from services.rpc.server import instance_grpc_server
from services.rpc.health_probe import main as probe
from tests.unit.gateway_fakes import FakeInstance


def probe_a_serving_instance(check) -> None:
    """Run `check(port)` in a thread while a plaintext instance server reports SERVING."""
    async def scenario():
        server = instance_grpc_server(FakeInstance("d0", "decode"), "127.0.0.1", 0, None)
        await server.start()
        await server.set_serving(True)
        try:
            await asyncio.to_thread(check, server.port)
        finally:
            await server.stop(0)
    asyncio.run(scenario())


def test_the_port_comes_from_the_ready_file_and_the_host_is_loopback(tmp_path, monkeypatch):
    ready_file = tmp_path / "ready.json"
    monkeypatch.setenv("PDSERVE_READY_FILE", str(ready_file))

    def check(port: int) -> None:
        assert probe([]) == 1, "no ready file yet: not healthy"
        # An instance advertises its container address; the probe asks its own loopback.
        ready_file.write_text(json.dumps({"grpc_address": f"10.255.0.7:{port}", "role": "decode"}))
        assert probe([]) == 0
        assert probe([f"127.0.0.1:{port}"]) == 0
        ready_file.write_text(json.dumps({"grpc_address": "127.0.0.1:1"}))
        assert probe([]) == 1, "a stale ready file's port answers nothing"
    probe_a_serving_instance(check)


def test_a_half_written_or_addressless_ready_file_is_not_healthy(tmp_path):
    ready_file = tmp_path / "ready.json"
    ready_file.write_text('{"grpc_addr')
    assert probe(["--ready-file", str(ready_file)]) == 1
    ready_file.write_text(json.dumps({"role": "decode"}))
    assert probe(["--ready-file", str(ready_file)]) == 1


def test_neither_an_address_nor_a_ready_file_is_a_usage_error(monkeypatch):
    monkeypatch.delenv("PDSERVE_READY_FILE", raising=False)
    with pytest.raises(SystemExit) as exit_info:
        probe([])
    assert exit_info.value.code == 2


def test_the_probe_imports_nothing_heavy():
    """Docker runs it every few seconds in every container, with a timeout: grpc only, no
    launcher, Redis, torch or transformers (those took seconds on a busy machine)."""
    code = ("import sys, services.rpc.health_probe; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in {'torch', 'redis', 'transformers', "
            "'shared'} or m.startswith('services.launcher')))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert result.stdout.strip() == "[]"
