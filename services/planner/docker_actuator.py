"""DockerActuator: resizes the prefill and decode services of a Docker Compose project through
the Docker Engine API, as `docker compose up --scale` would.

Scale-out creates containers copied from the service's newest one (image, command,
environment, health check, restart policy, stop timeout, networks with the service's alias,
volumes, compose labels with the next container number), so `docker compose ps` and `down`
see them as the service's own. Scale-in stops the newest containers with their stop timeout
(SIGTERM: each drains; the stop_grace_period outlasts the drain) and then removes them, in
background threads: `scale` returns at once, and a container being stopped no longer counts.
"""

import logging
import os
import socket
import threading

from services.planner.docker_engine import DockerEngine, DockerEngineError

logger = logging.getLogger(__name__)

PROJECT_LABEL = "com.docker.compose.project"
SERVICE_LABEL = "com.docker.compose.service"
NUMBER_LABEL = "com.docker.compose.container-number"
ONEOFF_LABEL = "com.docker.compose.oneoff"
# Config fields a copy keeps; Hostname and Domainname are left to Docker (each copy its own).
COPIED_CONFIG = ("Image", "Cmd", "Entrypoint", "Env", "WorkingDir", "User", "ExposedPorts", "Volumes",
                 "Healthcheck", "StopSignal", "StopTimeout", "Tty", "OpenStdin", "StdinOnce")
OWN_NETWORK_MODES = ("default", "bridge")


def container_number(container: dict) -> int:
    return int(container["Labels"].get(NUMBER_LABEL, "0"))


def copy_of(spec: dict, service: str, number: int) -> tuple[dict, dict[str, dict]]:
    """The create body for another replica of the inspected container `spec`, and the networks
    it joins after the first ({name: endpoint config})."""
    config = spec["Config"]
    body = {key: config[key] for key in COPIED_CONFIG if config.get(key) is not None}
    body["Labels"] = {**(config.get("Labels") or {}), NUMBER_LABEL: str(number)}
    body["HostConfig"] = dict(spec["HostConfig"])
    networks = {}
    mode = body["HostConfig"].get("NetworkMode", "default")
    if mode not in ("host", "none") and not mode.startswith("container:"):
        for name, endpoint in (spec.get("NetworkSettings", {}).get("Networks") or {}).items():
            networks[name] = {"Aliases": [service], "Links": endpoint.get("Links")}
    if networks:
        first = next(iter(networks))
        body["NetworkingConfig"] = {"EndpointsConfig": {first: networks.pop(first)}}
    return body, networks


class DockerActuator:
    def __init__(self, engine: DockerEngine, project: str, services: dict[str, str],
                 stop_timeout_s: float | None = None):
        """`services`: role -> compose service name. `stop_timeout_s`: None = each container's own."""
        self.engine = engine
        self.project = project
        self.services = dict(services)
        self.stop_timeout_s = stop_timeout_s
        self._lock = threading.Lock()
        self._stopping: set[str] = set()
        self._threads: list[threading.Thread] = []

    @classmethod
    def for_this_container(cls, socket_path: str, project: str, services: dict[str, str]) -> "DockerActuator":
        """`project` "": the compose project of the container the planner runs in."""
        engine = DockerEngine(socket_path)
        if not project:
            project = own_project(engine)
        return cls(engine, project, services)

    def replicas(self, role: str) -> int:
        return len(self._live(role))

    def scale(self, role: str, replicas: int) -> None:
        live = self._live(role)
        service = self.services[role]
        if replicas > len(live):
            logger.info("scaling %s/%s out: %d -> %d", self.project, service, len(live), replicas)
            for _ in range(replicas - len(live)):
                self._start_copy(role)
        for container in reversed(live[replicas:]):
            logger.info("scaling %s/%s in: stopping %s", self.project, service, container["Names"][0].lstrip("/"))
            with self._lock:
                self._stopping.add(container["Id"])
            thread = threading.Thread(target=self._stop_and_remove, args=(container["Id"],), daemon=True,
                                      name=f"stop-{container['Id'][:12]}")
            self._threads.append(thread)
            thread.start()

    def wait_stopped(self, timeout_s: float | None = None) -> None:
        """Until every container this actuator is stopping has been removed."""
        for thread in list(self._threads):
            thread.join(timeout_s)

    def _labels(self, role: str) -> dict[str, str]:
        return {PROJECT_LABEL: self.project, SERVICE_LABEL: self.services[role], ONEOFF_LABEL: "False"}

    def _live(self, role: str) -> list[dict]:
        """Running containers of the role's service not being stopped, oldest first."""
        with self._lock:
            stopping = set(self._stopping)
        running = [c for c in self.engine.containers(self._labels(role)) if c["Id"] not in stopping]
        return sorted(running, key=container_number)

    def _start_copy(self, role: str) -> None:
        service = self.services[role]
        every = sorted(self.engine.containers(self._labels(role), all_states=True), key=container_number)
        if not every:
            raise DockerEngineError(404, f"no container of service {service} in project {self.project} to copy")
        template = next((c for c in reversed(every) if c["State"] == "running"), every[-1])
        number = container_number(every[-1]) + 1
        body, more_networks = copy_of(self.engine.inspect(template["Id"]), service, number)
        container_id = self.engine.create(f"{self.project}_{service}_{number}", body)
        for network, endpoint in more_networks.items():
            self.engine.connect(network, container_id, endpoint)
        self.engine.start(container_id)
        logger.info("started %s_%s_%d (%s)", self.project, service, number, container_id[:12])

    def _stop_and_remove(self, container_id: str) -> None:
        try:
            self.engine.stop(container_id, self.stop_timeout_s)
            self.engine.remove(container_id)
        except (OSError, DockerEngineError):
            logger.exception("stopping container %s failed", container_id[:12])
        finally:
            with self._lock:
                self._stopping.discard(container_id)


def own_project(engine: DockerEngine) -> str:
    """The compose project label of this container (found by its hostname, the container id)."""
    own_id = os.environ.get("HOSTNAME") or socket.gethostname()
    try:
        labels = engine.inspect(own_id)["Config"]["Labels"] or {}
    except DockerEngineError as error:
        raise DockerEngineError(error.status, f"cannot find this container ({own_id}) to learn its compose "
                                              "project; set --docker-project") from None
    if PROJECT_LABEL not in labels:
        raise DockerEngineError(404, f"container {own_id} has no {PROJECT_LABEL} label; set --docker-project")
    return labels[PROJECT_LABEL]
