"""The three kinds of failure, so every front door maps each to the right status:

    InvalidRequestError -> the client sent something wrong (gRPC INVALID_ARGUMENT, HTTP 400);
                           `field` names what.
    ConfigurationError  -> a setting is wrong: the process refuses to start, naming the
                           setting; met while serving, it is the server's fault (INTERNAL, 500).
    InternalError       -> a bug: an invariant of the code itself broke (INTERNAL, 500).

services/rpc/errors.py maps them to gRPC status codes; the gateway's HTTP API maps those
codes to HTTP statuses (services/gateway/http/errors.py).
"""


class InvalidRequestError(ValueError):
    """A request or parameter is invalid. `field` names the offending field."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class ConfigurationError(Exception):
    """A setting (flag, PDSERVE_* variable, settings file or constructor argument) is invalid.
    `field` names the setting. Not a ValueError, so that pydantic validators let it through."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class InternalError(RuntimeError):
    """An invariant of pdserve itself does not hold: a bug, never the client's fault."""


# Trailing metadata key of an instance's answer when the request itself failed in the engine
# (the instance is healthy: the gateway neither retries elsewhere nor marks it failed).
REQUEST_FAILED_METADATA_KEY = "pdserve-request-failed"
