"""KV receiver addresses ("host:port"), parsed without importing the transport."""

from shared.errors import InvalidRequestError


def parse_address(address: str) -> tuple[str, int]:
    """Split a KVReceiver address "host:port" (or "[v6-host]:port")."""
    host, separator, port_text = address.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not separator or not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise InvalidRequestError("address", f"expected 'host:port', got {address!r}")
    return host, int(port_text)
