"""The planner's Docker actuator against a fake Docker Engine API served on a Unix socket: it
counts a compose service's running replicas, scales out by copying the newest one (compose
labels with the next number, the service's network alias, no hostname), and scales in by
stopping the newest with its own stop timeout (it stops counting at once) and removing it.
The real thing runs in `make test-compose`."""

import json
import socketserver
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler

import pytest

from services.planner.docker_actuator import DockerActuator, own_project
from services.planner.docker_engine import DockerEngine, DockerEngineError

PROJECT = "stack"


def container(number: int, service: str = "decode", project: str = PROJECT, state: str = "running",
              network_mode: str = "stack_default") -> dict:
    labels = {"com.docker.compose.project": project, "com.docker.compose.service": service,
              "com.docker.compose.container-number": str(number), "com.docker.compose.oneoff": "False",
              "com.docker.compose.config-hash": "abc"}
    return {
        "Id": f"{service}{number}{project}".ljust(64, "0"), "Name": f"/{project}_{service}_{number}", "State": state,
        "Config": {"Image": "pdserve:latest", "Cmd": [service], "Env": ["PDSERVE_GRPC_PORT=50053"],
                   "Hostname": f"host{number}", "Labels": labels, "StopTimeout": 150,
                   "Healthcheck": {"Test": ["CMD", "python", "-m", "services.rpc.health_probe"]}},
        "HostConfig": {"NetworkMode": network_mode, "RestartPolicy": {"Name": "unless-stopped"}},
        "NetworkSettings": {"Networks": {} if network_mode == "host" else {
            network_mode: {"Aliases": [service, f"host{number}"], "Links": None}}},
    }


class FakeDocker(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True

    def __init__(self, path: str, containers: list[dict]):
        self.containers = {c["Id"]: c for c in containers}
        self.calls: list[tuple[str, str, dict, dict | None]] = []
        self.release_stops = threading.Event()
        self.release_stops.set()
        super().__init__(path, FakeDockerHandler)


class FakeDockerHandler(BaseHTTPRequestHandler):
    server: FakeDocker

    def log_message(self, *args) -> None:
        pass

    def reply(self, status: int, body=None) -> None:
        data = b"" if body is None else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if data:
            self.wfile.write(data)

    def handle_call(self, method: str) -> None:
        url = urllib.parse.urlparse(self.path)
        query = {k: v[0] for k, v in urllib.parse.parse_qs(url.query).items()}
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length)) if length else None
        self.server.calls.append((method, url.path, query, body))
        parts = url.path.strip("/").split("/")
        containers = self.server.containers
        if parts == ["containers", "json"]:
            wanted = dict(item.split("=", 1) for item in json.loads(query["filters"])["label"])
            listed = [{"Id": c["Id"], "Names": [c["Name"]], "Labels": c["Config"]["Labels"], "State": c["State"]}
                      for c in containers.values()
                      if wanted.items() <= c["Config"]["Labels"].items() and (query["all"] == "1" or c["State"] == "running")]
            return self.reply(200, listed)
        if parts == ["containers", "create"]:
            new_id = f"new{len(containers)}".ljust(64, "0")
            containers[new_id] = {"Id": new_id, "Name": "/" + query["name"], "State": "created",
                                  "Config": {**body, "Labels": body["Labels"]}, "HostConfig": body["HostConfig"]}
            return self.reply(201, {"Id": new_id})
        found = next((c for c in containers.values() if len(parts) > 1 and c["Id"].startswith(parts[1])), None)
        if found is None:
            return self.reply(404, {"message": f"No such container: {parts[1] if len(parts) > 1 else ''}"})
        if method == "GET":
            return self.reply(200, found)
        if method == "DELETE":
            del containers[found["Id"]]
            return self.reply(204)
        if parts[2] == "start":
            found["State"] = "running"
        elif parts[2] == "stop":
            self.server.release_stops.wait(10)
            found["State"] = "exited"
        return self.reply(204)

    def do_GET(self) -> None:
        self.handle_call("GET")

    def do_POST(self) -> None:
        self.handle_call("POST")

    def do_DELETE(self) -> None:
        self.handle_call("DELETE")


@pytest.fixture
def docker(tmp_path):
    def start(*containers: dict) -> tuple[FakeDocker, DockerActuator]:
        server = FakeDocker(str(tmp_path / "docker.sock"), list(containers))
        threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True).start()
        servers.append(server)
        actuator = DockerActuator(DockerEngine(str(tmp_path / "docker.sock")), PROJECT,
                                  {"prefill": "prefill", "decode": "decode"})
        return server, actuator
    servers: list[FakeDocker] = []
    yield start
    for server in servers:
        server.release_stops.set()
        server.shutdown()
        server.server_close()


def test_replicas_are_the_services_running_containers_of_this_project(docker):
    _, actuator = docker(container(1), container(2), container(3, state="exited"), container(1, "prefill"),
                         container(1, project="other"))
    assert actuator.replicas("decode") == 2
    assert actuator.replicas("prefill") == 1


def test_scale_out_copies_the_newest_replica_with_the_next_number(docker):
    server, actuator = docker(container(1), container(2), container(3, state="exited"))
    actuator.scale("decode", 4)
    creates = [(query, body) for method, path, query, body in server.calls if path == "/containers/create"]
    assert [query["name"] for query, _ in creates] == ["stack_decode_4", "stack_decode_5"]
    _, body = creates[0]
    assert body["Labels"]["com.docker.compose.container-number"] == "4"
    assert body["Labels"]["com.docker.compose.config-hash"] == "abc"
    assert (body["Image"], body["Cmd"], body["Env"]) == ("pdserve:latest", ["decode"], ["PDSERVE_GRPC_PORT=50053"])
    assert body["HostConfig"]["RestartPolicy"] == {"Name": "unless-stopped"} and body["StopTimeout"] == 150
    assert body["Healthcheck"]["Test"][-1] == "services.rpc.health_probe"
    assert body["NetworkingConfig"] == {"EndpointsConfig": {"stack_default": {"Aliases": ["decode"], "Links": None}}}
    assert "Hostname" not in body
    assert actuator.replicas("decode") == 4


def test_on_the_host_network_a_copy_joins_no_network(docker):
    server, actuator = docker(container(1, network_mode="host"))
    actuator.scale("decode", 2)
    body = next(body for _, path, _, body in server.calls if path == "/containers/create")
    assert "NetworkingConfig" not in body and body["HostConfig"]["NetworkMode"] == "host"


def test_scale_in_stops_the_newest_with_its_own_timeout_and_it_stops_counting_at_once(docker):
    server, actuator = docker(container(1), container(2), container(3))
    server.release_stops.clear()  # the stop call returns only once the container has drained
    actuator.scale("decode", 1)
    assert actuator.replicas("decode") == 1
    server.release_stops.set()
    actuator.wait_stopped(10)
    stops = [(path, query) for method, path, query, _ in server.calls if path.endswith("/stop")]
    assert sorted(path.split("/")[2][:7] for path, _ in stops) == ["decode2", "decode3"]
    assert all("t" not in query for _, query in stops), "the container's stop_grace_period applies"
    assert sorted(c["Name"] for c in server.containers.values()) == ["/stack_decode_1"]


def test_a_service_without_any_container_cannot_be_scaled_out(docker):
    _, actuator = docker(container(1, "prefill"))
    with pytest.raises(DockerEngineError, match="no container of service decode"):
        actuator.scale("decode", 1)


def test_the_project_is_the_planners_own_containers(docker, monkeypatch):
    planner = container(1, "planner", project="mystack")
    server, actuator = docker(planner)
    monkeypatch.setenv("HOSTNAME", planner["Id"][:12])
    assert own_project(actuator.engine) == "mystack"
    monkeypatch.setenv("HOSTNAME", "not-a-container")
    with pytest.raises(DockerEngineError, match="set --docker-project"):
        own_project(actuator.engine)
