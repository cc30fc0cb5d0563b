"""deploy/compose: the compose file is valid for docker-compose, has the four services with
gRPC health checks, and lets prefill and decode scale (no fixed names or host ports)."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
COMPOSE_DIR = REPO_ROOT / "deploy" / "compose"
COMPOSE_FILE = COMPOSE_DIR / "docker-compose.yml"
SCALED = ("prefill", "decode")
PDSERVE_SERVICES = ("gateway", "prefill", "decode")


@pytest.fixture(scope="module")
def config() -> dict:
    """The file as docker-compose resolves it (`config` fails on an invalid file)."""
    if shutil.which("docker-compose") is None:
        pytest.fail("docker-compose is not installed; run `make setup`")
    result = subprocess.run(["docker-compose", "-f", str(COMPOSE_FILE), "config"],
                            capture_output=True, text=True, cwd=REPO_ROOT, timeout=60)
    assert result.returncode == 0, f"docker-compose config failed:\n{result.stderr}"
    return yaml.safe_load(result.stdout)


def test_services(config):
    assert set(config["services"]) == {"redis", "gateway", "prefill", "decode"}


def test_roles_are_the_container_commands(config):
    for name in PDSERVE_SERVICES:
        assert config["services"][name]["command"] == [name]


def test_every_service_has_a_health_check(config):
    for name, service in config["services"].items():
        assert service.get("healthcheck", {}).get("test"), f"{name} has no health check"


def test_pdserve_health_checks_use_the_grpc_health_service(config):
    for name in PDSERVE_SERVICES:
        test = " ".join(config["services"][name]["healthcheck"]["test"])
        assert "services.launcher.probe" in test, f"{name}: {test}"


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
    assert (REPO_ROOT / "services" / "launcher" / "probe.py").is_file()


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


def test_entrypoint_keeps_explicit_addresses_and_leaves_the_gateway_alone(tmp_path):
    assert run_entrypoint(tmp_path, "decode", PDSERVE_ADVERTISE_HOST="a", PDSERVE_UCX_HOST="b") == \
        "serve decode|a|b"
    assert run_entrypoint(tmp_path) == "serve gateway||"
