"""The one error type for bad input, so every front door can map it to a clear status."""


class InvalidRequestError(ValueError):
    """A request or parameter is invalid. `field` names the offending field."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


# Trailing metadata key of an instance's answer when the request itself failed in the engine
# (the instance is healthy: the gateway neither retries elsewhere nor marks it failed).
REQUEST_FAILED_METADATA_KEY = "pdserve-request-failed"
