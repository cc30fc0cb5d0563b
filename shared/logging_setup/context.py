"""The request id of the work in progress, as a context variable, and the logging filter that
puts it (and fixed fields such as role and instance id) on every record.

asyncio copies context variables into each task it creates, so an id bound at the start of an
RPC handler's task reaches every line logged inside that handler and the tasks it starts.
"""

import contextvars
import logging
from collections.abc import Mapping

_request_id: contextvars.ContextVar[str | None] = contextvars.ContextVar("pdserve_request_id", default=None)


def bind_request_id(request_id: str | None) -> contextvars.Token:
    """Called by RPC handlers when a request's work starts (in that request's own task)."""
    return _request_id.set(request_id or None)


def current_request_id() -> str | None:
    return _request_id.get()


class ContextFilter(logging.Filter):
    """Adds `request_id` (when bound and not given with `extra`) and the fixed fields."""

    def __init__(self, fields: Mapping[str, str] | None = None):
        super().__init__()
        self.fields = dict(fields or {})

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "request_id", None) is None:
            request_id = _request_id.get()
            if request_id is not None:
                record.request_id = request_id
        for name, value in self.fields.items():
            if not hasattr(record, name):
                setattr(record, name, value)
        return True
