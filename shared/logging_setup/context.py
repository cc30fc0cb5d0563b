"""The request id of the work in progress, as a context variable, and the logging filter that
puts it (and fixed fields such as role and instance id) on every record.

asyncio copies context variables into each task it creates, so an id bound at the start of an
RPC handler's task reaches every line logged inside that handler and the tasks it starts.

While tracing is on, each request's trace id is also remembered by request id (the last
MAX_REMEMBERED_TRACE_IDS requests), so a line logged outside the request's context but naming
its request id (`extra={"request_id": ...}`: the engine thread's observers, the engine-core
process's step loop, which serves every request at once) carries the trace id too.
"""

import contextvars
import logging
from collections.abc import Callable, Mapping

_request_id: contextvars.ContextVar[str | None] = contextvars.ContextVar("pdserve_request_id", default=None)


def bind_request_id(request_id: str | None) -> contextvars.Token:
    """Called by RPC handlers when a request's work starts (in that request's own task); while
    tracing is on, also remembers the current trace id as the request's."""
    source = _trace_id_source
    if request_id and source is not None:
        trace_id = source()
        if trace_id is not None:
            remember_trace_id(request_id, trace_id)
    return _request_id.set(request_id or None)


MAX_REMEMBERED_TRACE_IDS = 8192
_trace_ids: dict[str, str] = {}  # request id -> trace id, oldest first


def remember_trace_id(request_id: str, trace_id: str) -> None:
    """`request_id`'s lines carry `trace_id` from now on (the oldest entry makes room)."""
    _trace_ids.pop(request_id, None)
    _trace_ids[request_id] = trace_id
    if len(_trace_ids) > MAX_REMEMBERED_TRACE_IDS:
        del _trace_ids[next(iter(_trace_ids))]


def trace_id_of(request_id: str) -> str | None:
    """The trace id remembered for a request id, or for `<id>` of `<id>#<index>` (n > 1)."""
    found = _trace_ids.get(request_id)
    return found if found is not None else _trace_ids.get(request_id.partition("#")[0])


def current_request_id() -> str | None:
    return _request_id.get()


# Where a record's trace id comes from (shared.tracing installs it while tracing is on).
_trace_id_source: Callable[[], str | None] | None = None


def set_trace_id_source(source: Callable[[], str | None] | None) -> None:
    """`source()` gives the trace id of the work in progress (None: none); None: no trace ids."""
    global _trace_id_source
    _trace_id_source = source
    _trace_ids.clear()


class ContextFilter(logging.Filter):
    """Adds `request_id` (when bound and not given with `extra`), `trace_id` (while tracing is
    on and the line is logged inside a traced request, or names a request whose trace id is
    remembered) and the fixed fields."""

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
            request_id = getattr(record, "request_id", None)
            if trace_id is None and isinstance(request_id, str):
                trace_id = trace_id_of(request_id)
            if trace_id is not None:
                record.trace_id = trace_id
        for name, value in self.fields.items():
            if not hasattr(record, name):
                setattr(record, name, value)
        return True
