"""`configure_logging`: what every entry point (pdserve CLI, gateway, instances) calls once."""

import logging
import sys
from collections.abc import Mapping

from shared.errors import ConfigurationError
from shared.logging_setup.context import ContextFilter
from shared.logging_setup.json_formatter import JsonFormatter

LOG_FORMATS = ("text", "json")


class _TextFormatter(logging.Formatter):
    """The plain format, with ` [request_id]` after the logger name when a line has one."""

    def __init__(self, prefix: str):
        super().__init__(f"%(asctime)s %(levelname)s {prefix}%(name)s%(request_tag)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        # A copy: other handlers (a JSON one, pytest's) format the same record after this one.
        tagged = logging.makeLogRecord(record.__dict__)
        request_id = getattr(record, "request_id", None)
        tagged.request_tag = f" [{request_id}]" if request_id else ""
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
