"""One JSON object per log line: ts, level, logger, message, then every extra field.

Extra fields are whatever a call passed with `extra=` or a filter set on the record
(request_id, instance_id, role, ...); values that JSON cannot hold are written as strings.
"""

import datetime
import json
import logging

# Attributes every LogRecord has; anything else on a record is an extra field.
_STANDARD_ATTRIBUTES = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}


def _timestamp(record: logging.LogRecord) -> str:
    moment = datetime.datetime.fromtimestamp(record.created, tz=datetime.timezone.utc)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {"ts": _timestamp(record), "level": record.levelname, "logger": record.name,
                 "message": record.getMessage()}
        for name, value in vars(record).items():
            if name not in _STANDARD_ATTRIBUTES and not name.startswith("_"):
                entry[name] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return json.dumps(entry, default=str, ensure_ascii=False)
