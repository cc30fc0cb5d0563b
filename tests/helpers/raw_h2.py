"""Raw HTTP/2 gRPC calls (the `h2` package over a plain socket), to send what no gRPC
client library would: a call ended with no message, a length prefix longer than its data,
odd headers. `raw_grpc_call` returns the grpc-status and grpc-message the server answered,
or None for a status when nothing came back within the timeout."""

import socket
import struct
import time
import urllib.parse
from dataclasses import dataclass

import h2.config
import h2.connection
import h2.events


@dataclass(frozen=True)
class RawReply:
    status: int | None  # grpc-status; None: no answer in time
    message: str
    seconds: float


def grpc_frame(payload: bytes, declared_length: int | None = None) -> bytes:
    """A gRPC length-prefixed message (uncompressed); `declared_length` may lie."""
    length = len(payload) if declared_length is None else declared_length
    return b"\x00" + struct.pack(">I", length) + payload


def raw_grpc_call(address: str, path: str, data: bytes | None, extra_headers=(), end_stream: bool = True,
                  timeout_s: float = 10.0) -> RawReply:
    host, port = address.rsplit(":", 1)
    started = time.monotonic()
    with socket.create_connection((host, int(port)), timeout=timeout_s) as sock:
        connection = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        connection.initiate_connection()
        headers = [(":method", "POST"), (":scheme", "http"), (":path", path), (":authority", address),
                   ("content-type", "application/grpc"), ("te", "trailers"), *extra_headers]
        connection.send_headers(1, headers, end_stream=data is None and end_stream)
        if data is not None:
            connection.send_data(1, data, end_stream=end_stream)
        sock.sendall(connection.data_to_send())
        return _read_status(sock, connection, started, timeout_s)


def _read_status(sock, connection, started: float, timeout_s: float) -> RawReply:
    status, message = None, ""
    while time.monotonic() - started < timeout_s:
        sock.settimeout(max(0.01, timeout_s - (time.monotonic() - started)))
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            break
        if not chunk:
            break
        for event in connection.receive_data(chunk):
            if isinstance(event, (h2.events.ResponseReceived, h2.events.TrailersReceived)):
                found = {_text(k): _text(v) for k, v in event.headers}
                if "grpc-status" in found:
                    status = int(found["grpc-status"])
                    message = urllib.parse.unquote(found.get("grpc-message", ""))
            if isinstance(event, (h2.events.StreamEnded, h2.events.StreamReset)) and status is not None:
                return RawReply(status, message, time.monotonic() - started)
        sock.sendall(connection.data_to_send())
    return RawReply(status, message, time.monotonic() - started)


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else value
