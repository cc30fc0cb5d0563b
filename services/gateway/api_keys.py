"""API keys at the gateway, as vLLM's --api-key: clients send `Authorization: Bearer <key>`
(HTTP header or gRPC metadata).

Keys come from `--api-key` (repeatable), `PDSERVE_API_KEY` (comma separated) and
`--api-keys-file` (one key a line; blank lines and `#` comments skipped). `identify` compares
the presented key with every configured key in constant time (hmac.compare_digest, no early
exit) and returns a key id, `key-<n>`, that logs, metrics and rate limits may use: a key itself
is never logged or shown.
"""

import hmac
from collections.abc import Iterable
from pathlib import Path

from shared.errors import ConfigurationError

BEARER_PREFIX = "bearer "
MAX_KEY_CHARS = 4096


class ApiKeys:
    def __init__(self, keys: Iterable[str] = ()):
        self._keys = [key.encode() for key in dict.fromkeys(k.strip() for k in keys) if key]

    @property
    def is_enabled(self) -> bool:
        return bool(self._keys)

    def __len__(self) -> int:
        return len(self._keys)

    def __repr__(self) -> str:
        return f"ApiKeys({len(self._keys)} keys)"

    def identify(self, authorization: str | None) -> str | None:
        """`key-<n>` for an `Authorization` value naming configured key n, else None."""
        presented = bearer_token(authorization)
        if presented is None:
            return None
        found = None
        for index, key in enumerate(self._keys):
            if hmac.compare_digest(presented, key) and found is None:
                found = f"key-{index}"
        return found


def bearer_token(authorization: str | None) -> bytes | None:
    if not authorization or len(authorization) > MAX_KEY_CHARS:
        return None
    if authorization[:len(BEARER_PREFIX)].lower() != BEARER_PREFIX:
        return None
    return authorization[len(BEARER_PREFIX):].strip().encode("utf-8", "surrogateescape")


def read_keys_file(path: str) -> list[str]:
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as error:
        raise ConfigurationError("api_keys_file", f"cannot read {path}: {error.strerror}") from error
    return [line.strip() for line in lines if line.strip() and not line.strip().startswith("#")]


def load_api_keys(keys: Iterable[str], keys_file: str | None) -> ApiKeys:
    return ApiKeys(list(keys) + (read_keys_file(keys_file) if keys_file else []))
