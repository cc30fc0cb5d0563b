"""AccessMiddleware: API keys and per-key rate limits on the gateway's HTTP port (ASGI).

`Authorization: Bearer <key>`; `/health` stays open, `/metrics` too unless the gateway runs
with --metrics-requires-key. Refusals are OpenAI-shaped: 401 (with WWW-Authenticate) or 429
with Retry-After. A streamed response holds its concurrency slot until it ends.
"""

import grpc

from services.gateway.access import AccessControl, AccessDenied
from services.gateway.http.errors import OpenAIError
from services.gateway.rate_limits import retry_after_header

ALWAYS_OPEN_PATHS = ("/health",)
METRICS_PATH = "/metrics"


class AccessMiddleware:
    def __init__(self, app, access: AccessControl):
        self.app = app
        self.access = access

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or not self.access.is_enabled or self._is_open(scope["path"]):
            await self.app(scope, receive, send)
            return
        try:
            key_id = self.access.admit(_header(scope, b"authorization"))
        except AccessDenied as denied:
            await _refusal(denied)(scope, receive, send)
            return
        try:
            await self.app(scope, receive, send)
        finally:
            self.access.release(key_id)

    def _is_open(self, path: str) -> bool:
        if path in ALWAYS_OPEN_PATHS:
            return True
        return path == METRICS_PATH and not self.access.metrics_requires_key


def _refusal(denied: AccessDenied):
    if denied.code == grpc.StatusCode.UNAUTHENTICATED:
        error = OpenAIError(401, denied.message, "authentication_error", None, "invalid_api_key")
        return error.response(headers={"www-authenticate": "Bearer"})
    error = OpenAIError(429, denied.message, "rate_limit_error", None, "rate_limit_exceeded")
    return error.response(headers={"retry-after": retry_after_header(denied.retry_after_s or 1.0)})


def _header(scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return value.decode("latin-1")
    return None
