"""Host names as servers bind and clients dial them."""

# Addresses that bind every interface: a client on this machine dials 127.0.0.1 instead.
WILDCARD_HOSTS = ("", "0.0.0.0", "::", "[::]")


def is_wildcard(host: str) -> bool:
    return host in WILDCARD_HOSTS


def local_host(host: str) -> str:
    """The host a client on this machine dials to reach a server bound to `host`."""
    return "127.0.0.1" if is_wildcard(host) else host


def host_port(host: str, port: int) -> str:
    """"host:port", with an IPv6 host in brackets."""
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"
