"""Every HTTP error in OpenAI's shape, whatever raises it.

`install_error_handlers(app)` covers the endpoints' body validation (400 naming the field),
the framework's own errors (404 unknown route, 405 wrong method, 400 unparsable body, naming
the field and the limit when valid JSON was over the parser's limits) and
any unhandled exception (500 with a fixed message; the traceback goes to the log, never to
the client).
"""

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException
from starlette.responses import Response

from services.gateway.http.errors import OpenAIError, from_http_status, from_validation_errors
from services.gateway.http.json_limits import parse_limit_error

logger = logging.getLogger(__name__)


async def _on_bad_body(request: Request, error: RequestValidationError) -> Response:
    return from_validation_errors(error.errors()).response()


async def _on_http_exception(request: Request, error: HTTPException) -> Response:
    over_a_limit = parse_limit_error(error.__cause__, getattr(request, "_body", None))  # starlette's read body
    if error.status_code == 400 and over_a_limit is not None:
        return over_a_limit.response()
    message = error.detail if isinstance(error.detail, str) else str(error.detail)
    if error.status_code == 404:
        message = f"no route {request.method} {request.url.path}"
    elif error.status_code == 405:
        message = f"method {request.method} is not allowed on {request.url.path}"
    return from_http_status(error.status_code, message).response(headers=error.headers)


async def _on_unhandled(request: Request, error: Exception) -> Response:
    logger.error("unhandled error on %s %s", request.method, request.url.path, exc_info=error)
    return OpenAIError(500, "internal server error; see the gateway log", "internal_error").response()


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(RequestValidationError, _on_bad_body)
    app.add_exception_handler(HTTPException, _on_http_exception)
    app.add_exception_handler(Exception, _on_unhandled)
