"""How RPC handlers fail: raise, and `rpc_errors` turns it into a gRPC status. The one map
from exceptions to status codes (`grpc_status_of`), for instances and the gateway alike; the
gateway's HTTP API maps codes on to HTTP statuses (services/gateway/http/errors.py).

    InvalidRequestError -> INVALID_ARGUMENT (the message starts with the field's name)
    ConfigurationError  -> INTERNAL (a bad setting of this server; the client can't fix it)
    InternalError       -> INTERNAL (a bug; logged with the request id)
    CapacityError       -> RESOURCE_EXHAUSTED (the gateway tries another instance)
    ServiceError        -> its own code: NOT_FOUND, FAILED_PRECONDITION, UNAVAILABLE, ABORTED
    EngineDeadError     -> UNAVAILABLE
    RequestFailedError  -> INTERNAL (this request failed in the engine; the engine serves on),
                           marked by REQUEST_FAILED_METADATA_KEY so the gateway does not fail over
    anything else       -> INTERNAL (logged with the request id)
"""

import contextlib
import logging

import grpc

from shared.engine_api.client import CapacityError, EngineDeadError, RequestFailedError
from shared.errors import REQUEST_FAILED_METADATA_KEY, ConfigurationError, InternalError, InvalidRequestError

from services.rpc.bounded_text import bounded

logger = logging.getLogger(__name__)


class ServiceError(Exception):
    """A request that cannot be served here, with the gRPC status code that says why."""

    def __init__(self, code: grpc.StatusCode, message: str, trailing_metadata: tuple[tuple[str, str], ...] = ()):
        super().__init__(message)
        self.code = code
        self.message = message
        self.trailing_metadata = trailing_metadata  # typed signals for the caller, e.g. a drain hand-back


def grpc_status_of(error: Exception) -> tuple[grpc.StatusCode, str]:
    """The status code and message a failed call answers with."""
    if isinstance(error, InvalidRequestError):
        return grpc.StatusCode.INVALID_ARGUMENT, str(error)
    if isinstance(error, ConfigurationError):
        return grpc.StatusCode.INTERNAL, f"server misconfigured: {error}"
    if isinstance(error, InternalError):
        return grpc.StatusCode.INTERNAL, f"internal error: {error}"
    if isinstance(error, CapacityError):
        return grpc.StatusCode.RESOURCE_EXHAUSTED, str(error)
    if isinstance(error, ServiceError):
        return error.code, error.message
    if isinstance(error, EngineDeadError):
        return grpc.StatusCode.UNAVAILABLE, f"engine failed: {error}"
    if isinstance(error, RequestFailedError):
        return grpc.StatusCode.INTERNAL, f"request failed in the engine: {error}"
    return grpc.StatusCode.INTERNAL, f"{type(error).__name__}: {error}"


@contextlib.asynccontextmanager
async def rpc_errors(context: grpc.aio.ServicerContext, method: str, request_id: str):
    """Abort the RPC with the status matching any exception raised inside (cancellation passes)."""
    try:
        yield
    except grpc.aio.AbortError:
        raise
    except Exception as error:  # noqa: BLE001 - every failure becomes a status
        code, message = grpc_status_of(error)
        message = bounded(message)
        fields = {"request_id": request_id or None, "status": code.name}
        if code == grpc.StatusCode.INTERNAL:
            logger.exception("%s %s failed", method, request_id, extra=fields)
        else:
            logger.info("%s %s: %s %s", method, request_id, code.name, message, extra=fields)
        trailing = ((REQUEST_FAILED_METADATA_KEY, "1"),) if isinstance(error, RequestFailedError) else ()
        if isinstance(error, ServiceError):
            trailing = error.trailing_metadata
        await context.abort(code, message, trailing_metadata=trailing)
