"""A minimal client of the Docker Engine API over its Unix socket (what the planner's Docker
actuator needs: list, inspect, create, start, stop and remove containers). JSON in and out;
any status >= 400 raises DockerEngineError with the daemon's message."""

import http.client
import json
import socket
import urllib.parse

DEFAULT_SOCKET = "/var/run/docker.sock"
# A stop call returns when the container has drained and exited: wait as long as that takes.
STOP_CALL_TIMEOUT_S = 3600.0


class DockerEngineError(RuntimeError):
    def __init__(self, status: int, message: str):
        super().__init__(f"Docker engine: {status}: {message}")
        self.status = status


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, socket_path: str, timeout_s: float | None):
        super().__init__("localhost", timeout=timeout_s)
        self.socket_path = socket_path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.socket_path)


class DockerEngine:
    def __init__(self, socket_path: str = DEFAULT_SOCKET, timeout_s: float = 30.0):
        self.socket_path = socket_path
        self.timeout_s = timeout_s

    def request(self, method: str, path: str, query: dict | None = None, body: dict | None = None,
                timeout_s: float | None = None):
        """The decoded JSON reply (None when empty)."""
        if query:
            path += "?" + urllib.parse.urlencode(query)
        connection = _UnixConnection(self.socket_path, timeout_s or self.timeout_s)
        try:
            payload = None if body is None else json.dumps(body).encode()
            headers = {"Content-Type": "application/json"} if payload is not None else {}
            connection.request(method, path, body=payload, headers=headers)
            response = connection.getresponse()
            data = response.read()
        finally:
            connection.close()
        if response.status >= 400:
            try:
                message = json.loads(data).get("message", "")
            except ValueError:
                message = data.decode(errors="replace")
            raise DockerEngineError(response.status, message)
        return json.loads(data) if data.strip() else None

    def containers(self, labels: dict[str, str], all_states: bool = False) -> list[dict]:
        """Containers carrying every one of `labels` (running ones unless `all_states`)."""
        filters = {"label": [f"{key}={value}" for key, value in labels.items()]}
        return self.request("GET", "/containers/json", {"all": int(all_states), "filters": json.dumps(filters)})

    def inspect(self, container: str) -> dict:
        return self.request("GET", f"/containers/{container}/json")

    def create(self, name: str, config: dict) -> str:
        return self.request("POST", "/containers/create", {"name": name}, config)["Id"]

    def connect(self, network: str, container: str, endpoint: dict) -> None:
        self.request("POST", f"/networks/{network}/connect", body={"Container": container, "EndpointConfig": endpoint})

    def start(self, container: str) -> None:
        self.request("POST", f"/containers/{container}/start")

    def stop(self, container: str, timeout_s: float | None = None) -> None:
        """SIGTERM, then SIGKILL after the container's stop timeout (or `timeout_s`); returns
        once it has stopped."""
        query = None if timeout_s is None else {"t": int(timeout_s)}
        self.request("POST", f"/containers/{container}/stop", query, timeout_s=STOP_CALL_TIMEOUT_S)

    def remove(self, container: str) -> None:
        self.request("DELETE", f"/containers/{container}", {"force": 1})
