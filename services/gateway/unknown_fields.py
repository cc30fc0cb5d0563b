"""Request fields the OpenAI endpoints do not know: accepted (clients send extras), logged once
per field name and counted by endpoint and name, so an operator sees what clients expect.

The count is the metric `pdserve:gateway_unknown_request_fields_total{endpoint, field}`. Field
names come from clients, so at most MAX_FIELD_NAMES distinct names are tracked (longer names
cut to MAX_NAME_CHARS); any further name is counted as OTHER_FIELDS.
"""

import logging
from collections import Counter
from collections.abc import Iterable

logger = logging.getLogger(__name__)

MAX_FIELD_NAMES = 64
MAX_NAME_CHARS = 64
OTHER_FIELDS = "_other"


class UnknownFields:
    def __init__(self):
        self.counts: Counter[tuple[str, str]] = Counter()  # (endpoint, field) -> requests
        self._seen: set[str] = set()

    def record(self, endpoint: str, field_names: Iterable[str]) -> None:
        for name in field_names:
            self.counts[(endpoint, self._tracked_name(name))] += 1

    def _tracked_name(self, name: str) -> str:
        name = name[:MAX_NAME_CHARS]
        if name in self._seen:
            return name
        if len(self._seen) >= MAX_FIELD_NAMES:
            return OTHER_FIELDS
        self._seen.add(name)
        logger.warning("request field %r is not known to this server: accepted and ignored "
                       "(further occurrences are counted in pdserve:gateway_unknown_request_fields_total)",
                       name)
        return name

    def rows(self) -> list[tuple[tuple[str, str], int]]:
        """((endpoint, field), count) for a labelled counter family."""
        return sorted(self.counts.items())
