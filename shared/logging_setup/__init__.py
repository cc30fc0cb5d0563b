"""Process-wide logging set-up shared by every pdserve entry point: plain text or one JSON
object per line, with request ids (and the service's role and instance id) as fields.

    configure_logging(level="INFO", log_format="json", context={"role": "decode"})
    logger.info("request %s finished", request_id, extra={"request_id": request_id})

Lines logged while serving one request carry its id even without `extra`: RPC handlers
call `bind_request_id(request_id)` (a context variable that a logging filter reads).
Log request ids, counts and timings; never prompt or generated text.
"""

from shared.logging_setup.configure import LOG_FORMATS, configure_child_logging, configure_logging
from shared.logging_setup.context import bind_request_id, current_request_id, remember_trace_id

__all__ = ["LOG_FORMATS", "bind_request_id", "configure_child_logging", "configure_logging", "current_request_id",
           "remember_trace_id"]
