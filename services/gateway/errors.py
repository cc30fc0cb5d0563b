"""Errors the gateway answers with, each carrying its gRPC status code; `from_exception` is the
gateway's one map from its own exceptions to status codes (the HTTP API maps the codes on to
HTTP statuses: services/gateway/http/errors.py)."""

import grpc

from shared.errors import ConfigurationError, InvalidRequestError

from services.rpc.bounded_text import bounded


class GatewayError(Exception):
    """An error to return to the client as `code` with `message` (bounded in size); with
    `retry_after_s`, the client is told when to retry (gRPC trailing metadata `retry-after`,
    HTTP header Retry-After, both in whole seconds)."""

    def __init__(self, code: grpc.StatusCode, message: str, retry_after_s: float | None = None):
        message = bounded(message)
        super().__init__(message)
        self.code = code
        self.message = message
        self.retry_after_s = retry_after_s


def invalid_argument(error: InvalidRequestError) -> GatewayError:
    return GatewayError(grpc.StatusCode.INVALID_ARGUMENT, str(error))


def from_exception(error: Exception) -> GatewayError:
    """Any exception raised while serving a call, as the client sees it: INVALID_ARGUMENT naming
    the field for a bad request, INTERNAL for a bad setting or a bug (details in the log only)."""
    if isinstance(error, GatewayError):
        return error
    if isinstance(error, InvalidRequestError):
        return invalid_argument(error)
    if isinstance(error, ConfigurationError):
        return GatewayError(grpc.StatusCode.INTERNAL, f"gateway misconfigured: {error.field}; see the gateway log")
    return GatewayError(grpc.StatusCode.INTERNAL, "internal gateway error; see the gateway log")


def model_not_found(requested: str, served: str, adapters: list[str] = ()) -> GatewayError:
    also = f" and the LoRA adapters {', '.join(map(repr, adapters))}" if adapters else ""
    return GatewayError(grpc.StatusCode.NOT_FOUND,
                        f"model: {bounded(requested, 256)!r} is not served here; this gateway serves {served!r}{also}")


def no_instances(why: str) -> GatewayError:
    """`why` no disaggregated pair can serve (services.gateway.router.no_pair_reason)."""
    return GatewayError(grpc.StatusCode.UNAVAILABLE, f"{why}, and no live colocated instance is registered")


def no_capacity(num_refused: int, role: str = "decode",
                error_class: type[GatewayError] = GatewayError) -> GatewayError:
    return error_class(grpc.StatusCode.RESOURCE_EXHAUSTED,
                       f"every {role} instance that answered ({num_refused}) refused the request for "
                       "lack of free KV blocks; retry later or with a shorter prompt or max_tokens")


def from_rpc_error(error: grpc.aio.AioRpcError, where: str) -> GatewayError:
    """A downstream failure as the client sees it: the code kept; the place named, except
    for INVALID_ARGUMENT, whose message must keep starting with the field's name."""
    if error.code() == grpc.StatusCode.INVALID_ARGUMENT:
        return GatewayError(error.code(), error.details() or "invalid request")
    return GatewayError(error.code(), f"{where}: {error.details()}")
