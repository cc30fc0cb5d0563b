"""`configure_logging`: what every entry point (pdserve CLI, gateway, instances) calls once;
`configure_child_logging`: what a process they start (engine core, parallel worker) calls, to
log the same way (level, format, context) with its own component name added."""

import json
import logging
import os
import sys
from collections.abc import Mapping

from shared.errors import ConfigurationError
from shared.logging_setup.context import ContextFilter
from shared.logging_setup.json_formatter import JsonFormatter

LOG_FORMATS = ("text", "json")
# How the parent process logs (JSON: level, format, context), inherited by its children.
CHILD_LOGGING_ENV_VAR = "PDSERVE_LOG_INHERITED"


class _TextFormatter(logging.Formatter):
    """The plain format, with ` [request_id]` after the logger name when a line has one
    (` [request_id trace=<trace id>]` inside a traced request)."""

    def __init__(self, prefix: str):
        super().__init__(f"%(asctime)s %(levelname)s {prefix}%(name)s%(request_tag)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        # A copy: other handlers (a JSON one, pytest's) format the same record after this one.
        tagged = logging.makeLogRecord(record.__dict__)
        request_id = getattr(record, "request_id", None)
        trace_id = getattr(record, "trace_id", None)
        tags = " ".join(filter(None, (request_id, f"trace={trace_id}" if trace_id else None)))
        tagged.request_tag = f" [{tags}]" if tags else ""
        return super().format(tagged)


def make_formatter(log_format: str, prefix: str = "") -> logging.Formatter:
    if log_format not in LOG_FORMATS:
        raise ConfigurationError("log_format", f"must be one of {LOG_FORMATS}, got {log_format!r}")
    return JsonFormatter() if log_format == "json" else _TextFormatter(prefix)


def make_handler(log_format: str, context: Mapping[str, str] | None = None, stream=None,
                 prefix: str = "") -> logging.Handler:
    """A stream handler (stderr by default) with the format and the context filter."""
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(make_formatter(log_format, prefix))
    handler.addFilter(ContextFilter(context))
    return handler


def configure_logging(level: str = "INFO", log_format: str = "text",
                      context: Mapping[str, str] | None = None, stream=None) -> None:
    """Replace the root logger's handlers with one in `log_format`; `context` fields (role,
    instance_id) go on every line (as JSON fields, or before the logger name in text)."""
    prefix = "".join(f"{value} " for value in (context or {}).values())
    handler = make_handler(log_format, context, stream, prefix)
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    os.environ[CHILD_LOGGING_ENV_VAR] = json.dumps({"level": level, "format": log_format,
                                                    "context": dict(context or {})})


def configure_child_logging(component: str) -> None:
    """Log as the parent process does, every line naming `component` too; text at INFO when the
    parent configured nothing (or something unreadable)."""
    try:
        inherited = json.loads(os.environ.get(CHILD_LOGGING_ENV_VAR) or "{}")
        level, log_format = inherited.get("level", "INFO"), inherited.get("format", "text")
        context = {**inherited.get("context", {}), "component": component}
        configure_logging(level, log_format, context)
    except (ValueError, TypeError, AttributeError, ConfigurationError):
        configure_logging("INFO", "text", {"component": component})
