"""Local prefills on a decode instance (conditional disaggregation): the gateway found a
prompt's uncached part short, or the prefill pool busy, and asks the decode instance holding
its reservation to compute the prompt itself (PrefillLocally) instead of receiving its KV.

The instance protects its running decodes. The prompt goes through its engine's scheduler as
any prompt does: each step gives every running decode its token first, then prompt chunks of
at most --max-prefill-chunk-tokens. And a budget caps the uncached prompt tokens of the local
prefills being computed at once (--max-local-prefill-tokens): one beyond it is refused with
RESOURCE_EXHAUSTED before anything changes, and the gateway prefills it on the pool into the
same reservation. A local prefill holds its share of the budget until its first token.
"""

import grpc

from services.rpc.errors import ServiceError


class LocalPrefillBudget:
    def __init__(self, max_tokens: int):
        self.max_tokens = max_tokens
        self.num_tokens = 0  # uncached prompt tokens of the local prefills being computed
        self.num_admitted = 0
        self.num_refused = 0

    def take(self, num_tokens: int) -> None:
        """Admit a local prefill of `num_tokens` uncached tokens, or refuse it (RESOURCE_EXHAUSTED)."""
        if self.num_tokens + num_tokens > self.max_tokens:
            self.num_refused += 1
            raise ServiceError(grpc.StatusCode.RESOURCE_EXHAUSTED,
                               f"no room for a local prefill of {num_tokens} tokens ({self.num_tokens} of "
                               f"--max-local-prefill-tokens {self.max_tokens} in progress)")
        self.num_tokens += num_tokens
        self.num_admitted += 1

    def give_back(self, num_tokens: int) -> None:
        self.num_tokens -= num_tokens
