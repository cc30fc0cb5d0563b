"""Errors in OpenAI's shape, `{"error": {"message", "type", "param", "code"}}`, with the HTTP
status each gateway (gRPC) status code maps to.

The endpoints turn every GatewayError, InvalidRequestError and body-parsing error into an
OpenAIError; a message that names a field starts with the OpenAI name of that field.
"""

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import grpc
from fastapi.responses import JSONResponse

from shared.errors import InvalidRequestError

from services.rpc.bounded_text import bounded
from services.gateway.errors import GatewayError
from services.gateway.rate_limits import retry_after_header

# gRPC status -> (HTTP status, error type, error code)
_STATUS = {
    grpc.StatusCode.INVALID_ARGUMENT: (400, "invalid_request_error", None),
    grpc.StatusCode.NOT_FOUND: (404, "invalid_request_error", "model_not_found"),
    grpc.StatusCode.RESOURCE_EXHAUSTED: (429, "rate_limit_error", "out_of_capacity"),
    grpc.StatusCode.UNAVAILABLE: (503, "service_unavailable_error", "no_backend"),
    grpc.StatusCode.DEADLINE_EXCEEDED: (504, "timeout_error", "deadline_exceeded"),
}
_INTERNAL = (500, "internal_error", None)
# HTTP status -> (error type, code) for errors raised outside the endpoints (routing, framework).
_HTTP_STATUS = {
    400: ("invalid_request_error", None),
    401: ("authentication_error", "invalid_api_key"),
    404: ("invalid_request_error", "not_found"),
    405: ("invalid_request_error", "method_not_allowed"),
    413: ("invalid_request_error", "request_too_large"),
    429: ("rate_limit_error", "rate_limit_exceeded"),
}
_FIELD_PREFIX = re.compile(r"^([A-Za-z_][\w.]*): (.*)$", re.DOTALL)


@dataclass(frozen=True)
class OpenAIError:
    status: int
    message: str
    type: str
    param: str | None = None
    code: str | None = None

    def body(self) -> dict:
        param = None if self.param is None else bounded(self.param, 128)
        return {"error": {"message": bounded(self.message), "type": self.type, "param": param,
                          "code": self.code}}

    def response(self, headers: Mapping[str, str] | None = None) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=headers)


def from_http_status(status: int, message: str) -> OpenAIError:
    """An error the framework raised (404 route, 405 method, 400 unparsable body...)."""
    kind, code = _HTTP_STATUS.get(status, ("invalid_request_error" if status < 500 else "internal_error", None))
    return OpenAIError(status, message, kind, None, code)


def bad_request(param: str | None, message: str) -> OpenAIError:
    return OpenAIError(400, message, "invalid_request_error", param)


def from_invalid_request(error: InvalidRequestError) -> OpenAIError:
    return bad_request(error.field, str(error))


def from_gateway_error(error: GatewayError, renamed: Mapping[str, str]) -> OpenAIError:
    """The gateway's status as HTTP; a bad field is renamed to what the client called it."""
    status, kind, code = _STATUS.get(error.code, _INTERNAL)
    param, message = None, error.message
    if error.code == grpc.StatusCode.INVALID_ARGUMENT:
        match = _FIELD_PREFIX.match(error.message)
        if match:
            param = renamed.get(match.group(1), match.group(1))
            message = f"{param}: {match.group(2)}"
    elif error.code == grpc.StatusCode.NOT_FOUND:
        param = "model"
    return OpenAIError(status, message, kind, param, code)


def gateway_error_response(error: GatewayError, renamed: Mapping[str, str]) -> JSONResponse:
    """The HTTP response for a GatewayError, with Retry-After when the gateway says when to retry."""
    headers = None
    if error.retry_after_s is not None:
        headers = {"retry-after": retry_after_header(error.retry_after_s)}
    return from_gateway_error(error, renamed).response(headers=headers)


def from_validation_errors(errors: Sequence[dict]) -> OpenAIError:
    """FastAPI's RequestValidationError list: the first problem, naming its top-level field."""
    if not errors:
        return bad_request(None, "invalid request body")
    first = errors[0]
    location = [str(part) for part in first.get("loc", ()) if part != "body"]
    if first.get("type") == "json_invalid" or not location:
        return bad_request(None, f"the request body is missing or not valid JSON: {first.get('msg', '')}")
    path = ".".join(location)
    return bad_request(location[0], f"{location[0]}: {first.get('msg', 'invalid')} (at {path})")
