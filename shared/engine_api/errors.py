"""The errors an engine client raises besides InvalidRequestError (shared.errors)."""


class EngineDeadError(RuntimeError):
    """The engine (thread or core process) failed; every request in flight gets this."""


class RequestFailedError(RuntimeError):
    """Computing this one request failed (finish reason "error"); the engine carries on."""


class CapacityError(RuntimeError):
    """The engine has no room for the request now (blocks or sequence slots)."""


class KVTransferFailedError(RuntimeError):
    """A KV transfer for this request failed (the request may be retried elsewhere)."""
