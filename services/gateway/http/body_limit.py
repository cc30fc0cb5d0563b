"""BodyLimit: an ASGI middleware that refuses request bodies over `max_bytes` with an
OpenAI-shaped 413, before FastAPI parses anything.

A declared Content-Length over the limit is refused at once; otherwise the body is read up
to the limit and handed on whole (the endpoints read it whole anyway), after which the app
reads the connection's later messages (disconnects) itself.
"""

from services.gateway.http.errors import OpenAIError


class BodyLimit:
    def __init__(self, app, max_bytes: int):
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if _declared_length(scope) > self.max_bytes:
            await self._refuse(scope, receive, send)
            return
        body, first_other = await self._read_body(receive)
        if body is None:
            await self._refuse(scope, receive, send)
            return
        await self.app(scope, _replay(body, first_other, receive), send)

    async def _read_body(self, receive):
        """(the whole body, None), (None, None) when over the limit, or (what came, the
        disconnect message) when the client left mid-body."""
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return b"".join(chunks), message
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.max_bytes:
                return None, None
            if not message.get("more_body", False):
                return b"".join(chunks), None

    async def _refuse(self, scope, receive, send) -> None:
        error = OpenAIError(413, f"the request body is over the limit of {self.max_bytes} bytes",
                            "invalid_request_error", None, "request_too_large")
        response = error.response()
        response.headers["connection"] = "close"
        await response(scope, receive, send)


def _declared_length(scope) -> int:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return 0
    return 0


def _replay(body: bytes, first_other, receive):
    """A receive() that returns the body once, then what the connection sends."""
    pending = [{"type": "http.request", "body": body, "more_body": False}]
    if first_other is not None:
        pending.append(first_other)

    async def replayed_receive():
        if pending:
            return pending.pop(0)
        return await receive()
    return replayed_receive
