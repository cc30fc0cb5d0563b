"""The local-prefill thresholds of the placement rule (services.gateway.placement), derived
from a `pdserve profile` of the instances, and the gateway's policy from its settings.

A local prefill puts the prompt's uncached tokens into the decode instance's steps, after its
running decodes' tokens: they cost those decodes the marginal compute of the tokens,
`prefill_s(n) - prefill_s(1)` (the per-step cost is paid by the step anyway). A prefill on the
pool costs the request the hop instead: the request path's overhead (`request_overhead_s`:
Reserve, the prefill instance's queue and RPC, Decode) plus the KV transfer `kv_transfer_s(n)`
before the decode instance can go on.

- `max_local_tokens`: the longest uncached part whose marginal compute is at most the hop
  (overhead plus transfer): below it, computing the prompt where it will be decoded costs
  less than moving it there.
- `busy_max_local_tokens`: while the pool is busy (the prompt would wait in a prefill queue),
  the longest uncached part whose marginal compute is at most one decode step of a lightly
  loaded instance (`decode_step_s(1, block_size)`): the running decodes lose at most about one
  step in all, the prompt skips the queue.
"""

from pathlib import Path

from shared.errors import ConfigurationError

from services.cost_model.perf_profile import PerfProfile
from services.gateway.placement import PlacementPolicy

# Without a profile: the thresholds derived from docs/autoscaling/profile-smollm2-cpu-fp32.json
# (14 and 47 tokens: SmolLM2-135M, 1 thread, fp32-compute CPU), rounded to a block of 16.
DEFAULT_MAX_LOCAL_TOKENS = 16
DEFAULT_BUSY_MAX_LOCAL_TOKENS = 48
DEFAULT_BUSY_BACKLOG = 2
MAX_THRESHOLD_TOKENS = 16_384


def derived_thresholds(profile: PerfProfile) -> tuple[int, int]:
    """(max_local_tokens, busy_max_local_tokens) from the profile's cost models."""
    def marginal_s(num_tokens: int) -> float:
        return profile.prefill_s(num_tokens) - profile.prefill_s(1)

    def hop_s(num_tokens: int) -> float:
        return profile.request_overhead_s + (profile.kv_transfer_s(num_tokens) or 0.0)

    step_s = profile.decode_step_s(1, profile.block_size)
    return (_longest(lambda n: marginal_s(n) <= hop_s(n)), _longest(lambda n: marginal_s(n) <= step_s))


def _longest(holds) -> int:
    """The largest n (up to MAX_THRESHOLD_TOKENS) for which `holds` is true of 1..n."""
    num_tokens = 0
    while num_tokens < MAX_THRESHOLD_TOKENS and holds(num_tokens + 1):
        num_tokens += 1
    return num_tokens


def load_profile(path: str) -> PerfProfile:
    try:
        return PerfProfile.load(Path(path))
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ConfigurationError("profile", f"cannot read {path}: {error}") from None


def placement_policy(max_local_tokens: int | None, busy_max_local_tokens: int | None, busy_backlog: int,
                     profile_path: str | None) -> PlacementPolicy:
    """The policy from the settings: a threshold not given comes from the profile, if one is
    given, else from the defaults above."""
    derived = (DEFAULT_MAX_LOCAL_TOKENS, DEFAULT_BUSY_MAX_LOCAL_TOKENS)
    if profile_path and (max_local_tokens is None or busy_max_local_tokens is None):
        derived = derived_thresholds(load_profile(profile_path))
    return PlacementPolicy(derived[0] if max_local_tokens is None else max_local_tokens,
                           derived[1] if busy_max_local_tokens is None else busy_max_local_tokens,
                           busy_backlog)
