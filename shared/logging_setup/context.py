"""The request id of the work in progress, as a context variable, and the logging filter that
puts it (and fixed fields such as role and instance id) on every record.

asyncio copies context variables into each task it creates, so an id bound at the start of an
RPC handler's task reaches every line logged inside that handler and the tasks it starts.
"""

import contextvars
import logging
from collections.abc import Callable, Mapping

_request_id: contextvars.ContextVar[str | None] = contextvars.ContextVar("pdserve_request_id", default=None)


def bind_request_id(request_id: str | None) -> contextvars.Token:
    """Called by RPC handlers when a request's work starts (in that request's own task)."""
    return _request_id.set(request_id or None)


def current_request_id() -> str | None:
    return _request_id.get()


# Where a record's trace id comes from (shared.tracing installs it while tracing is on).
_trace_id_source: Callable[[], str | None] | None = None


def set_trace_id_source(source: Callable[[], str | None] | None) -> None:
    """`source()` gives the trace id of the work in progress (None: none); None: no trace ids."""
    global _trace_id_source
    _trace_id_source = source


class ContextFilter(logging.Filter):
    """Adds `request_id` (when bound and not given with `extra`), `trace_id` (while tracing is
    on and the line is logged inside a traced request) and the fixed fields."""

    def __init__(self, fields: Mapping[str, str] | None = None):
        super().__init__()
        self.fields = dict(fields or {})

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "request_id", None) is None:
            request_id = _request_id.get()
            if request_id is not None:
                record.request_id = request_id
        source = _trace_id_source
        if source is not None and getattr(record, "trace_id", None) is None:
            trace_id = source()
            if trace_id is not None:
                record.trace_id = trace_id
        for name, value in self.fields.items():
            if not hasattr(record, name):
                setattr(record, name, value)
        return True
