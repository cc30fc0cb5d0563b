"""The Redis key scheme for cluster state, in one place.

Every key lives under `pdserve:{deployment}:{model}:`, so two deployments (or two models
served by one deployment) sharing a Redis never see each other's state. The registry,
prefix index and lease mirror build all their keys through `ClusterNamespace`.

Layout (all under the namespace prefix):
    instances                      set of registered instance ids (enumeration, no SCAN)
    instance:{instance_id}         hash of InstanceInfo + InstanceLoad fields, with a TTL
    prefix:indexed                 set of instance ids that have a prefix set
    prefix:held:{instance_id}      set of raw 32-byte block hashes the instance holds
    prefix:tier:{tier_id}          set of raw block hashes a host's KV tiers hold (shared by
                                   the instances of that host, each adding what it stored)
    kv_tiers:{instance_id}         hash tier -> JSON of the instance's tier counters, with a TTL
    ownership:{instance_id}:{request_id}
                                   JSON lease record (request -> blocks), with a TTL

Per deployment (not per model): `pdserve:{deployment}:supervisor`, the hash `pdserve up`'s
supervisor publishes its children's restart counts in (services.launcher.supervision_board).
"""

import re
from dataclasses import dataclass

from shared.errors import InternalError, InvalidRequestError

KEY_ROOT = "pdserve"
BLOCK_HASH_NUM_BYTES = 32

# Names that become key segments: no ':' (segment separator) and no glob characters,
# so SCAN patterns built from them never need escaping.
_NAME_PATTERN = re.compile(r"[A-Za-z0-9._\-/@]{1,200}")


def validate_name(field: str, value: object) -> str:
    """Check a deployment, model or instance id used inside keys; return it unchanged."""
    if not isinstance(value, str) or not _NAME_PATTERN.fullmatch(value):
        raise InvalidRequestError(
            field, f"must be 1-200 characters of [A-Za-z0-9._-/@], got {value!r}"
        )
    return value


def validate_block_hashes(block_hashes: object) -> list[bytes]:
    """Check a sequence of block hashes (32-byte SHA-256 digests); return it as a list."""
    if isinstance(block_hashes, (bytes, str)) or not hasattr(block_hashes, "__iter__"):
        raise InternalError("block_hashes: must be a list of 32-byte digests")
    hashes = list(block_hashes)
    for index, block_hash in enumerate(hashes):
        if not isinstance(block_hash, bytes) or len(block_hash) != BLOCK_HASH_NUM_BYTES:
            raise InternalError(f"block_hashes: item {index} must be {BLOCK_HASH_NUM_BYTES} bytes, "
                                f"got {block_hash!r}")
    return hashes


@dataclass(frozen=True)
class ClusterNamespace:
    """Deployment + model whose cluster state one set of keys describes."""

    deployment: str
    model: str

    def __post_init__(self) -> None:
        validate_name("deployment", self.deployment)
        validate_name("model", self.model)

    @property
    def prefix(self) -> str:
        return f"{KEY_ROOT}:{self.deployment}:{self.model}"

    def instances(self) -> str:
        return f"{self.prefix}:instances"

    def instance(self, instance_id: str) -> str:
        return f"{self.prefix}:instance:{instance_id}"

    def prefix_indexed(self) -> str:
        return f"{self.prefix}:prefix:indexed"

    def prefix_held(self, instance_id: str) -> str:
        return f"{self.prefix}:prefix:held:{instance_id}"

    def prefix_tier(self, tier_id: str) -> str:
        return f"{self.prefix}:prefix:tier:{tier_id}"

    def kv_tiers(self, instance_id: str) -> str:
        return f"{self.prefix}:kv_tiers:{instance_id}"

    def ownership(self, instance_id: str, request_id: str) -> str:
        return f"{self.prefix}:ownership:{instance_id}:{request_id}"

    def ownership_pattern(self) -> str:
        """SCAN pattern matching every ownership key of this namespace."""
        return f"{self.prefix}:ownership:*"


def supervisor_key(deployment: str) -> str:
    """The restart board of the `pdserve up` supervising this deployment."""
    return f"{KEY_ROOT}:{validate_name('deployment', deployment)}:supervisor"
