"""AccessControl: who may call the gateway and how often, the same for both front doors.

`admit(authorization)` returns the caller's key id (`key-<n>`, or "anonymous" when the
gateway has no keys) or raises AccessDenied: UNAUTHENTICATED (HTTP 401) for a missing or
wrong key, RESOURCE_EXHAUSTED (HTTP 429 with Retry-After) over the key's request rate or
concurrency. Every admitted call is paired with `release(key_id)` when it ends.
"""

import grpc

from services.gateway.api_keys import ApiKeys
from services.gateway.rate_limits import KeyRateLimiter

ANONYMOUS = "anonymous"


class AccessDenied(Exception):
    def __init__(self, code: grpc.StatusCode, message: str, retry_after_s: float | None = None):
        super().__init__(message)
        self.code = code
        self.message = message
        self.retry_after_s = retry_after_s


class AccessControl:
    def __init__(self, keys: ApiKeys | None = None, limiter: KeyRateLimiter | None = None,
                 metrics_requires_key: bool = False):
        self.keys = keys or ApiKeys()
        self.limiter = limiter or KeyRateLimiter()
        self.metrics_requires_key = metrics_requires_key
        self.num_unauthenticated = 0  # calls refused for a missing or wrong key

    @property
    def is_enabled(self) -> bool:
        return self.keys.is_enabled or self.limiter.is_enabled

    def admit(self, authorization: str | None) -> str:
        key_id = self.authenticate(authorization)
        retry_after_s = self.limiter.admit(key_id)
        if retry_after_s is not None:
            raise AccessDenied(grpc.StatusCode.RESOURCE_EXHAUSTED,
                               f"rate limit of {key_id} reached; retry in {retry_after_s:.2f} s", retry_after_s)
        return key_id

    def authenticate(self, authorization: str | None) -> str:
        if not self.keys.is_enabled:
            return ANONYMOUS
        key_id = self.keys.identify(authorization)
        if key_id is None:
            reason = "missing" if not authorization else "not valid"
            self.num_unauthenticated += 1
            raise AccessDenied(grpc.StatusCode.UNAUTHENTICATED,
                               f"the API key is {reason}: send 'Authorization: Bearer <key>'")
        return key_id

    def release(self, key_id: str) -> None:
        self.limiter.release(key_id)
