"""deploy/compose: the compose file is valid for docker-compose, has the services with gRPC
health checks, restart policies, JSON logs and stop grace periods longer than each drain, lets
prefill and decode scale (no fixed names or host ports), and the test overlay keeps every
container on loopback (host networking) while the shipped file keeps the bridge network."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
COMPOSE_DIR = REPO_ROOT / "deploy" / "compose"
COMPOSE_FILE = COMPOSE_DIR / "docker-compose.yml"
HOST_OVERLAY = REPO_ROOT / "tests" / "compose" / "docker-compose.host.yml"
SCALED = ("prefill", "decode")
PDSERVE_SERVICES = ("gateway", "prefill", "decode")
OVERLAY_VARIABLES = {"TEST_REDIS_IMAGE": "redis-test", "TEST_PROJECT": "p", "TEST_REDIS_PORT": "16379",
                     "TEST_GATEWAY_PORT": "16051", "TEST_HTTP_PORT": "16800", "TEST_PLANNER_PORT": "16900"}


def compose_config(*files: Path, **variables: str) -> dict:
    """The files as docker-compose resolves them (`config` fails on an invalid file), with only
    `variables` in the environment, so the file's own defaults count."""
    if shutil.which("docker-compose") is None:
        pytest.fail("docker-compose is not installed; run `make setup`")
    command = ["docker-compose"] + [arg for path in files for arg in ("-f", str(path))] + ["config"]
    result = subprocess.run(command, capture_output=True, text=True, cwd=REPO_ROOT, timeout=60,
                            env={"PATH": os.environ["PATH"], **variables})
    assert result.returncode == 0, f"docker-compose config failed:\n{result.stderr}"
    return yaml.safe_load(result.stdout)


@pytest.fixture(scope="module")
def config() -> dict:
    return compose_config(COMPOSE_FILE)


@pytest.fixture(scope="module")
def host_config() -> dict:
    """What the compose scenario runs (tests/compose/compose_cli.py)."""
    from tests.compose.compose_cli import host_network_config

    return host_network_config(compose_config(COMPOSE_FILE, HOST_OVERLAY, **OVERLAY_VARIABLES))


def seconds(duration: str) -> float:
    """A compose duration ("30s", "2m30s") in seconds."""
    units = {"h": 3600, "m": 60, "s": 1, "ms": 0.001}
    return sum(float(value) * units[unit] for value, unit in re.findall(r"([\d.]+)(ms|h|m|s)", duration))


def test_services(config):
    assert set(config["services"]) == {"redis", "gateway", "prefill", "decode", "planner"}
    assert config["services"]["planner"]["profiles"] == ["autoscale"]


def test_roles_are_the_container_commands(config):
    for name in PDSERVE_SERVICES:
        assert config["services"][name]["command"] == [name]


def test_every_service_has_a_health_check(config):
    for name, service in config["services"].items():
        assert service.get("healthcheck", {}).get("test"), f"{name} has no health check"


def test_pdserve_health_checks_use_the_grpc_health_service_at_the_port_in_the_ready_file(config):
    for name in PDSERVE_SERVICES:
        assert config["services"][name]["healthcheck"]["test"] == ["CMD", "python", "-m", "services.rpc.health_probe"]
    assert "PDSERVE_READY_FILE=" in (COMPOSE_DIR / "Dockerfile").read_text()


def test_every_service_restarts_unless_stopped_and_logs_json_lines(config):
    for name, service in config["services"].items():
        assert service["restart"] == "unless-stopped", name
        assert service["logging"]["driver"] == "json-file" and service["logging"]["options"]["max-size"], name
        if name != "redis":
            assert service["environment"]["PDSERVE_LOG_FORMAT"] == "json", name


def test_stop_grace_periods_outlast_the_drain(config):
    services = config["services"]
    gateway = services["gateway"]
    assert seconds(gateway["stop_grace_period"]) > float(gateway["environment"]["PDSERVE_DRAIN_TIMEOUT_S"])
    for name in SCALED:
        environment = services[name]["environment"]
        drain = float(environment["PDSERVE_DRAIN_TIMEOUT_S"]) + float(environment["PDSERVE_SHUTDOWN_GRACE_S"])
        assert seconds(services[name]["stop_grace_period"]) > drain, name
    assert seconds("2m30s") == 150


def test_the_image_and_the_model_come_from_local_files(config):
    for name in (*PDSERVE_SERVICES, "planner"):
        service = config["services"][name]
        assert service["image"] == "pdserve:latest"
        assert service["environment"]["PDSERVE_MODEL"] == "/opt/pdserve/models/SmolLM2-135M-Instruct"
    assert "PDSERVE_MODEL=/opt/pdserve/models/SmolLM2-135M-Instruct" in (COMPOSE_DIR / "Dockerfile").read_text()


def test_the_planner_scales_the_pools_through_the_docker_socket(config):
    planner = config["services"]["planner"]
    assert planner["command"] == ["planner"]
    assert planner["environment"]["PDSERVE_PLANNER_ACTUATOR"] == "docker"
    assert "/var/run/docker.sock:/var/run/docker.sock:rw" in planner["volumes"]
    assert planner["depends_on"]["gateway"]["condition"] == "service_healthy"


def test_the_shipped_file_keeps_the_bridge_network(config):
    assert all("network_mode" not in service for service in config["services"].values())


def test_the_test_overlay_keeps_every_container_on_loopback(host_config):
    services = host_config["services"]
    assert all(service["network_mode"] == "host" and "ports" not in service for service in services.values())
    for name in PDSERVE_SERVICES:
        environment = services[name]["environment"]
        assert environment["PDSERVE_HOST"] == "127.0.0.1", name
        assert environment["PDSERVE_REDIS_URL"] == "redis://127.0.0.1:16379/0", name
    for name in SCALED:
        environment = services[name]["environment"]
        assert environment["PDSERVE_ADVERTISE_HOST"] == environment["PDSERVE_UCX_HOST"] == "127.0.0.1"
        assert environment["PDSERVE_GRPC_PORT"] == "0", "replicas share the host: ephemeral ports"
    assert services["gateway"]["environment"]["PDSERVE_HTTP_HOST"] == "127.0.0.1"
    assert services["planner"]["environment"]["PDSERVE_PLANNER_METRICS_HOST"] == "127.0.0.1"
    redis_command = services["redis"]["command"]
    assert redis_command[redis_command.index("--bind") + 1] == "127.0.0.1"
    assert services["redis"]["image"] == "redis-test"


def test_scaled_services_have_no_fixed_names_or_host_ports(config):
    for name in SCALED:
        service = config["services"][name]
        assert "container_name" not in service, name
        assert "ports" not in service, f"{name} publishes host ports: {service['ports']}"
        assert "hostname" not in service, name


def test_instances_wait_for_a_healthy_redis(config):
    for name in PDSERVE_SERVICES:
        assert config["services"][name]["depends_on"]["redis"]["condition"] == "service_healthy"


def test_configuration_is_environment_variables(config):
    for name in PDSERVE_SERVICES:
        environment = config["services"][name]["environment"]
        assert environment["PDSERVE_REDIS_URL"] == "redis://redis:6379/0"
        assert environment["PDSERVE_HOST"] == "0.0.0.0"
    for name in SCALED:
        assert "PDSERVE_GRPC_PORT" in config["services"][name]["environment"]


def test_only_the_gateway_publishes_ports_grpc_and_openai_http(config):
    ports = config["services"]["gateway"]["ports"]
    assert [port["target"] for port in ports] == [50051, 8000]
    environment = config["services"]["gateway"]["environment"]
    assert environment["PDSERVE_HTTP_HOST"] == "0.0.0.0" and environment["PDSERVE_HTTP_PORT"] == "8000"


def test_one_image_built_from_the_repository(config):
    for name in PDSERVE_SERVICES:
        build = config["services"][name]["build"]
        assert Path(build["context"]).resolve() == REPO_ROOT
        assert (REPO_ROOT / build["dockerfile"]).is_file()


def test_dockerfile_entrypoint_and_probe_exist():
    dockerfile = (COMPOSE_DIR / "Dockerfile").read_text()
    assert "ENTRYPOINT" in dockerfile and "entrypoint.sh" in dockerfile
    assert (REPO_ROOT / "services" / "rpc" / "health_probe.py").is_file()


FAKE_PDSERVE = '#!/bin/sh\necho "$*|${PDSERVE_ADVERTISE_HOST:-}|${PDSERVE_UCX_HOST:-}"\n'


def run_entrypoint(tmp_path: Path, *args: str, **env: str) -> str:
    """deploy/compose/entrypoint.sh with a stand-in `pdserve` that echoes what it got."""
    fake = tmp_path / "pdserve"
    fake.write_text(FAKE_PDSERVE)
    fake.chmod(0o755)
    path = f"{tmp_path}:{Path(sys.executable).parent}:/usr/bin:/bin"
    result = subprocess.run(["sh", str(COMPOSE_DIR / "entrypoint.sh"), *args], capture_output=True,
                            text=True, env={"PATH": path, **env}, timeout=30)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_entrypoint_makes_instances_advertise_their_own_address(tmp_path):
    command, advertise, ucx = run_entrypoint(tmp_path, "prefill", "--num-threads", "2").split("|")
    assert command == "serve prefill --num-threads 2"
    assert advertise and advertise == ucx


def test_entrypoint_keeps_explicit_addresses_and_leaves_the_gateway_and_planner_alone(tmp_path):
    assert run_entrypoint(tmp_path, "decode", PDSERVE_ADVERTISE_HOST="a", PDSERVE_UCX_HOST="b") == \
        "serve decode|a|b"
    assert run_entrypoint(tmp_path) == "serve gateway||"
    assert run_entrypoint(tmp_path, "planner", "--actuator", "docker") == "serve planner --actuator docker||"


def test_entrypoint_runs_other_commands_as_given(tmp_path):
    assert run_entrypoint(tmp_path, "pdserve", "status", "--redis-url", "redis://r") == "status --redis-url redis://r||"


def test_entrypoint_removes_the_ready_file_of_the_containers_previous_run(tmp_path):
    stale = tmp_path / "ready.json"
    stale.write_text('{"grpc_address": "127.0.0.1:1"}')
    assert run_entrypoint(tmp_path, "prefill", PDSERVE_READY_FILE=str(stale)).startswith("serve prefill|")
    assert not stale.exists()
