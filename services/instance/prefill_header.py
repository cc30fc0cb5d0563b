"""The prefill endpoints an endpoint picker names in a request's headers (GAIE P/D).

Behind a Gateway API Inference Extension gateway, the endpoint picker (llm-d's inference
scheduler, for one) chooses this pod to decode a request and may choose a prefill endpoint for
it too, which it passes in a header: `x-gateway-prefill-endpoints: host:port[,host:port]`, or
llm-d's `x-prefiller-host-port: host:port` (both read; the first one present wins). Each
endpoint is a prefill instance's gRPC address as it registered it. No header: no endpoints,
the prompt is computed here. A value that is not a list of host:port is malformed (the
request still runs, computed here: services.instance.pod_streams).
"""

from collections.abc import Mapping
from dataclasses import dataclass

PREFILL_HEADERS = ("x-gateway-prefill-endpoints", "x-prefiller-host-port")
MAX_ENDPOINTS = 8
MAX_PORT = 65535


@dataclass(frozen=True)
class NamedPrefills:
    addresses: tuple[str, ...] = ()  # "host:port", in the header's order
    malformed: str = ""  # why the header could not be read ("" when it could, or is absent)

    @property
    def is_named(self) -> bool:
        return bool(self.addresses)


def named_prefills(headers: Mapping[str, str]) -> NamedPrefills:
    """The endpoints of the first prefill header present (header names are case-insensitive:
    Starlette's Headers, or a dict with lower-case keys)."""
    for name in PREFILL_HEADERS:
        value = headers.get(name)
        if value is not None:
            return parse_endpoints(name, value)
    return NamedPrefills()


def parse_endpoints(name: str, value: str) -> NamedPrefills:
    addresses = tuple(part.strip() for part in value.split(",") if part.strip())
    if not addresses:
        return NamedPrefills(malformed=f"{name}: empty")
    if len(addresses) > MAX_ENDPOINTS:
        return NamedPrefills(malformed=f"{name}: {len(addresses)} endpoints, at most {MAX_ENDPOINTS}")
    for address in addresses:
        why = _address_problem(address)
        if why:
            return NamedPrefills(malformed=f"{name}: {address[:80]!r} {why}")
    return NamedPrefills(addresses)


def _address_problem(address: str) -> str:
    host, sep, port = address.rpartition(":")
    if not sep or not host or host in ("[", "[]"):
        return "is not host:port"
    if not port.isascii() or not port.isdigit() or not 0 < int(port) <= MAX_PORT:
        return f"has no port in 1..{MAX_PORT}"
    if any(c.isspace() or c in "/@?#" for c in host):
        return "has a bad host"
    return ""
