"""services.launcher with stand-in services (tests/helpers/fake_service.py) and a real Redis:
start order and readiness, failures at start, a child dying, SIGKILL after the grace period,
SIGTERM of `run_stack`, and the CLI flag plumbing of `pdserve up` / `pdserve serve`."""

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import redis

from services.launcher import LocalStack, StackConfig, StackError
from services.launcher.readiness import is_serving
from services.cli.main import build_parser
from services.cli.serve_command import service_argv
from services.cli.up_command import config_from_args

REPO_ROOT = Path(__file__).resolve().parents[2]
FAKE = "tests.helpers.fake_service"
FAKE_MODULES = {kind: FAKE for kind in ("gateway", "prefill", "decode", "colocated")}


def fake_config(tmp_path: Path, **overrides) -> StackConfig:
    values = dict(num_prefill=1, num_decode=2, gateway_port=0, run_dir=tmp_path / "run",
                  ready_timeout_s=60.0, stop_grace_s=60.0, service_modules=FAKE_MODULES)
    values.update(overrides)
    return StackConfig(**values)


def with_modes(monkeypatch, **modes: str) -> None:
    for name, mode in modes.items():
        monkeypatch.setenv(f"FAKE_SERVICE_MODE_{name.upper()}", mode)


def test_start_waits_for_every_service_then_stop_ends_them_all(tmp_path):
    stack = LocalStack(fake_config(tmp_path))
    stack.start()
    try:
        names = [child.name for child in stack.children()]
        assert names == ["redis", "prefill-0", "decode-0", "decode-1", "gateway"]
        for name in names[1:]:
            assert is_serving(stack.addresses[name]), name
        assert redis.Redis.from_url(stack.redis_url).ping()
        assert stack.find_dead_child() is None
    finally:
        stack.stop()
    assert [child.exit_code() for child in stack.children()] == [0, 0, 0, 0, 0]


def test_colocated_stack_runs_no_prefill(tmp_path):
    config = fake_config(tmp_path, colocated=True, num_decode=2)
    assert config.instance_roles() == [("colocated-0", "colocated"), ("colocated-1", "colocated")]


def test_a_child_failing_at_start_is_reported_and_the_rest_stopped(tmp_path, monkeypatch):
    with_modes(monkeypatch, decode_1="exit_at_start")
    stack = LocalStack(fake_config(tmp_path))
    with pytest.raises(StackError, match=r"decode-1 exited with status 3"):
        stack.start()
    assert all(not child.is_running() for child in stack.children())


def test_a_child_never_serving_times_out(tmp_path, monkeypatch):
    with_modes(monkeypatch, prefill_0="not_serving")
    stack = LocalStack(fake_config(tmp_path, ready_timeout_s=3.0))
    with pytest.raises(StackError, match=r"prefill-0 at .* was not SERVING in time"):
        stack.start()
    assert all(not child.is_running() for child in stack.children())


def test_an_instance_never_registered_in_redis_times_out(tmp_path, monkeypatch):
    """SERVING is not enough: a gateway routes only to the instances its listing of Redis shows."""
    with_modes(monkeypatch, decode_1="unregistered")
    stack = LocalStack(fake_config(tmp_path, ready_timeout_s=3.0))
    with pytest.raises(StackError, match=r"decode-1 was not registered in Redis \(pdserve:default:fake-model\) in time"):
        stack.start()
    assert all(not child.is_running() for child in stack.children())


def test_the_gateway_starts_beside_the_instances(tmp_path, monkeypatch):
    """It loads its tokenizer while they load the model, not after."""
    with_modes(monkeypatch, prefill_0="not_serving")
    stack = LocalStack(fake_config(tmp_path, ready_timeout_s=3.0))
    with pytest.raises(StackError, match=r"prefill-0 at .* was not SERVING in time"):
        stack.start()
    assert stack.gateway is not None and stack.gateway.exit_code() is not None


def test_watch_returns_the_child_that_died(tmp_path, monkeypatch):
    with_modes(monkeypatch, decode_0="die_after")
    stack = LocalStack(fake_config(tmp_path))
    stack.start()
    try:
        dead = stack.watch(threading.Event())
    finally:
        stack.stop()
    assert dead.name == "decode-0" and dead.exit_code() == 4


def test_watch_returns_none_once_asked_to_stop(tmp_path):
    stack = LocalStack(fake_config(tmp_path, num_decode=1))
    stack.start()
    stop_event = threading.Event()
    threading.Timer(0.5, stop_event.set).start()
    try:
        assert stack.watch(stop_event) is None
    finally:
        stack.stop()


def test_a_child_ignoring_sigterm_is_killed_after_the_grace(tmp_path, monkeypatch):
    with_modes(monkeypatch, prefill_0="ignore_term")
    stack = LocalStack(fake_config(tmp_path, num_decode=1, stop_grace_s=1.0))
    stack.start()
    started = time.monotonic()
    stack.stop()
    assert time.monotonic() - started < 8.0
    assert stack.instances[0].exit_code() == -signal.SIGKILL
    assert stack.instances[1].exit_code() == 0


def test_redis_restarts_empty_on_the_same_port(tmp_path):
    stack = LocalStack(fake_config(tmp_path, num_decode=1))
    stack.start()
    try:
        client = redis.Redis.from_url(stack.redis_url)
        client.set("k", "v")
        url = stack.redis_url
        stack.redis.restart()
        assert stack.redis_url == url
        assert client.get("k") is None
    finally:
        stack.stop()


RUN_STACK_SCRIPT = """
import sys
from pathlib import Path
from services.launcher.config import StackConfig
from services.launcher.run import run_stack
modules = {kind: "tests.helpers.fake_service" for kind in ("gateway", "prefill", "decode")}
config = StackConfig(gateway_port=0, run_dir=Path(sys.argv[1]), service_modules=modules)
sys.exit(run_stack(config))
"""


def test_run_stack_prints_where_to_send_requests_and_stops_on_sigterm(tmp_path):
    process = subprocess.Popen([sys.executable, "-c", RUN_STACK_SCRIPT, str(tmp_path / "run")],
                               cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                               text=True)
    lines = []
    for line in process.stdout:
        lines.append(line)
        if line.startswith("Press Ctrl-C"):
            break
    output = "".join(lines)
    assert re.search(r"send requests to the gateway at 127\.0\.0\.1:\d+", output), output
    pids = [int(pid) for pid in re.findall(r"\bpid (\d+)", output)]
    assert len(pids) == 4  # redis, prefill-0, decode-0, gateway
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=30) == 0
    for pid in pids:
        assert not os.path.exists(f"/proc/{pid}") or _is_zombie(pid), f"pid {pid} still running"


def _is_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except OSError:
        return True


def test_up_flags_become_a_stack_config():
    args = build_parser().parse_args(
        ["up", "--num-prefill", "2", "--num-decode", "3", "--gateway-port", "0", "--dtype",
         "float32", "--num-threads", "1", "--decode-arg=--num-blocks", "--decode-arg", "64"])
    config = config_from_args(args)
    assert (config.num_prefill, config.num_decode, config.gateway_port) == (2, 3, 0)
    assert (config.dtype, config.num_threads, config.colocated) == ("float32", 1, False)
    assert config.extra_args["decode"] == ["--num-blocks", "64"]
    assert [name for name, _ in config.instance_roles()] == [
        "prefill-0", "prefill-1", "decode-0", "decode-1", "decode-2"]


def test_up_defaults_match_make_run():
    config = config_from_args(build_parser().parse_args(["up"]))
    assert (config.host, config.gateway_port, config.num_prefill, config.num_decode) == (
        "127.0.0.1", 50051, 1, 1)
    assert config.model is None


@pytest.mark.parametrize("role, module, argv", [
    ("gateway", "services.gateway", ["--port", "0"]),
    ("prefill", "services.prefill", ["--port", "0"]),
    ("decode", "services.decode", ["--role", "decode", "--port", "0"]),
    ("colocated", "services.decode", ["--role", "colocated", "--port", "0"]),
])
def test_serve_forwards_the_remaining_args(role, module, argv):
    args = build_parser().parse_args(["serve", role, "--port", "0"])
    assert service_argv(args.role, args.service_args) == (module, argv)


def test_instance_k_in_start_order_publishes_kv_events_on_the_port_plus_k(tmp_path):
    stack = LocalStack(fake_config(tmp_path, kv_events_endpoint="tcp://*:5557"))
    stack.start()
    try:
        flags = [[arg for arg in child.argv if arg.startswith("--kv-events-")] for child in stack.instances]
        assert flags == [[f"--kv-events-endpoint=tcp://*:{5557 + k}", f"--kv-events-rank={k}"] for k in range(3)]
    finally:
        stack.stop()


def test_up_passes_the_kv_events_settings_on():
    args = build_parser().parse_args(["up", "--kv-events-endpoint", "tcp://*:6000", "--kv-events-topic", "kv",
                                      "--kv-events-format", "map"])
    config = config_from_args(args)
    assert config.kv_events_endpoint == "tcp://*:6000"
    assert config.extra_args["instance"][-2:] == ["--kv-events-topic=kv", "--kv-events-format=map"]
