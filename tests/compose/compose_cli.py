"""The docker and docker-compose command lines, as the compose scenario drives them: one project
(the shipped file plus the host-networking overlay), its containers by service, their health,
restarts and images, and the faults (kill, stop)."""

import json
import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from services.planner.docker_engine import DockerEngine

ENGINE = DockerEngine()  # the Engine API: far cheaper to poll than a docker CLI process per call
REPO_ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILES = (REPO_ROOT / "deploy" / "compose" / "docker-compose.yml",
                 Path(__file__).resolve().parent / "docker-compose.host.yml")
RESOLVED_DIR = REPO_ROOT / "build" / "compose-test"


class CommandFailed(RuntimeError):
    pass


def run(command: list[str], env: dict[str, str] | None = None, timeout_s: float = 600.0) -> str:
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=timeout_s)
    if result.returncode != 0:
        raise CommandFailed(f"{' '.join(command)} exited {result.returncode}:\n{result.stderr[-3000:]}")
    return result.stdout


def resolved_config(env: dict[str, str]) -> dict:
    """The shipped file with the host-networking overlay, as docker-compose resolves them."""
    command = ["docker-compose"] + [arg for path in COMPOSE_FILES for arg in ("-f", str(path))] + ["config"]
    return yaml.safe_load(run(command, env, timeout_s=60))


def host_network_config(config: dict) -> dict:
    """`config` without the published ports of services on the host's network: Docker refuses
    them there (the ports the services bind are the host's own), and an overlay can only add
    to a list, never remove from it."""
    for service in config["services"].values():
        if service.get("network_mode") == "host":
            service.pop("ports", None)
    return config


@dataclass(frozen=True)
class Container:
    id: str
    name: str
    service: str
    number: int
    image: str
    running: bool
    health: str  # "healthy", "starting", "unhealthy" or "" (no health check)
    restart_count: int
    exit_code: int


class ComposeProject:
    def __init__(self, name: str, variables: dict[str, str]):
        self.name = name
        self.env = {**os.environ, **variables}

    def compose(self, *args: str, timeout_s: float = 600.0, **variables: str) -> str:
        env = {**self.env, **variables}
        resolved = RESOLVED_DIR / f"{self.name}.yml"
        resolved.parent.mkdir(parents=True, exist_ok=True)
        resolved.write_text(yaml.safe_dump(host_network_config(resolved_config(env)), sort_keys=False))
        return run(["docker-compose", "-p", self.name, "-f", str(resolved), *args], env, timeout_s)

    def up(self, *services: str, scale: dict[str, int] | None = None, no_recreate: bool = True,
           no_deps: bool = False, **variables: str) -> None:
        """`up -d`, never building or pulling (every image is local)."""
        args = ["up", "-d", "--no-build"]
        if no_recreate:
            args.append("--no-recreate")
        if no_deps:
            args.append("--no-deps")
        for service, count in (scale or {}).items():
            args += ["--scale", f"{service}={count}"]
        self.compose(*args, *services, **variables)

    def containers(self, service: str | None = None, all_states: bool = False) -> list[Container]:
        """The project's containers (running ones unless `all_states`), oldest number first."""
        labels = {"com.docker.compose.project": self.name}
        if service:
            labels["com.docker.compose.service"] = service
        found = [inspect(listed["Id"]) for listed in ENGINE.containers(labels, all_states)]
        return sorted(found, key=lambda c: (c.service, c.number))

    def running(self, service: str) -> list[Container]:
        return [c for c in self.containers(service) if c.running]

    def down(self) -> None:
        self.compose("--profile", "autoscale", "down", "--remove-orphans", "--timeout", "60", timeout_s=900)


def inspect(container_id: str) -> Container:
    data = ENGINE.inspect(container_id)
    labels = data["Config"]["Labels"] or {}
    state = data["State"]
    return Container(id=data["Id"][:12], name=data["Name"].lstrip("/"),
                     service=labels.get("com.docker.compose.service", ""),
                     number=int(labels.get("com.docker.compose.container-number", "0")),
                     image=data["Config"]["Image"], running=bool(state["Running"]),
                     health=(state.get("Health") or {}).get("Status", ""), restart_count=int(data["RestartCount"]),
                     exit_code=int(state["ExitCode"]))


def kill(container: Container, signal: str = "KILL") -> None:
    run(["docker", "kill", "--signal", signal, container.id])


def stop(container: Container) -> float:
    """`docker stop`: SIGTERM, then SIGKILL after the container's stop timeout (compose's
    stop_grace_period); returns how long it took."""
    started = time.monotonic()
    run(["docker", "stop", container.id], timeout_s=900)
    return time.monotonic() - started


def start(container: Container) -> None:
    run(["docker", "start", container.id])


def remove(container: Container) -> None:
    run(["docker", "rm", "-f", container.id])


def logs(container: Container, tail: int = 40) -> str:
    result = subprocess.run(["docker", "logs", "--tail", str(tail), container.id], capture_output=True, text=True)
    return result.stdout + result.stderr


def image_exists(tag: str) -> bool:
    return subprocess.run(["docker", "image", "inspect", tag], capture_output=True).returncode == 0


def ready_info(container: Container) -> dict | None:
    """The service's ready file (where it listens), read inside the container; None if absent."""
    result = subprocess.run(["docker", "exec", container.id, "sh", "-c", 'cat "$PDSERVE_READY_FILE"'],
                            capture_output=True, text=True)
    try:
        return json.loads(result.stdout) if result.returncode == 0 else None
    except ValueError:
        return None


def probe(container: Container) -> bool:
    """The container's own health probe answers SERVING."""
    return subprocess.run(["docker", "exec", container.id, "python", "-m", "services.rpc.health_probe"],
                          capture_output=True).returncode == 0


def main_pid(container: Container) -> int:
    return int(ENGINE.inspect(container.id)["State"]["Pid"])


def image_size_bytes(tag: str) -> int:
    return int(run(["docker", "image", "inspect", "-f", "{{.Size}}", tag]).strip())
