"""What an engine instance tells the cluster about itself: identity, cache settings and
versions (InstanceInfo) and current load (InstanceLoad), plus their flat Redis-hash encoding (plain
string fields; the cache settings as `cache_*` fields, shared.cluster.cache_settings).

InstanceRegistry writes and reads these; gateways use them to pick instances.
"""

import json
from dataclasses import dataclass, fields

from shared.cluster.cache_settings import decode_cache_settings, encode_cache_settings, validate_cache_settings
from shared.cluster.keys import validate_name
from shared.cluster.versions import KV_PROTOCOL_VERSION, PDSERVE_VERSION, UNREGISTERED_PROTOCOL
from shared.engine_api.client import CacheSettings
from shared.errors import InvalidRequestError

ROLES = ("prefill", "decode", "colocated")
# An instance's state in the registry: SERVING takes new work; DRAINING (after SIGTERM, until
# its accepted work is done and it deregisters) is shown and counted but never given new work.
SERVING, DRAINING = "serving", "draining"
STATES = (SERVING, DRAINING)


def validate_role(role: object) -> str:
    """Check an instance role; return it unchanged."""
    if role not in ROLES:
        raise InvalidRequestError("role", f"must be one of {ROLES}, got {role!r}")
    return role


@dataclass(frozen=True)
class InstanceInfo:
    """Identity of one engine instance; fixed for its lifetime but for `state` (and the
    LoRA adapters it serves)."""

    instance_id: str
    role: str
    grpc_address: str
    ucx_address: str
    model: str
    # What its KV cache was built with; None in records of instances that registered none.
    cache: CacheSettings | None = None
    # Its host's KV tiers in the prefix index ("": none; absent from older records).
    kv_tier_id: str = ""
    # Rolling upgrades (shared.cluster.versions): gateways pair only equal KV protocol versions;
    # a record without one (an older release) reads as UNREGISTERED_PROTOCOL and pairs with nobody.
    pdserve_version: str = PDSERVE_VERSION
    kv_protocol_version: int = KV_PROTOCOL_VERSION
    # The LoRA adapters it serves: (name, key) pairs, the key part of their block hashes.
    lora_adapters: tuple[tuple[str, str], ...] = ()
    # SERVING or DRAINING; records of older releases carry none and read as SERVING.
    state: str = SERVING
    # Where it publishes KV-cache events (--kv-events-endpoint; "": it does not).
    kv_events_endpoint: str = ""

    @property
    def is_draining(self) -> bool:
        return self.state == DRAINING

    def adapter_key(self, name: str) -> str | None:
        """The key of adapter `name` here, None when it does not serve it."""
        return dict(self.lora_adapters).get(name)

    def __post_init__(self) -> None:
        validate_name("instance_id", self.instance_id)
        validate_role(self.role)
        if not isinstance(self.grpc_address, str) or not self.grpc_address:
            raise InvalidRequestError("grpc_address", "must be a non-empty string")
        if not isinstance(self.ucx_address, str):
            raise InvalidRequestError("ucx_address", "must be a string (empty if none)")
        validate_name("model", self.model)
        if self.cache is not None:
            validate_cache_settings(self.cache)
        if self.kv_tier_id:
            validate_name("kv_tier_id", self.kv_tier_id)
        if not isinstance(self.pdserve_version, str):
            raise InvalidRequestError("pdserve_version", f"must be a string, got {self.pdserve_version!r}")
        if (isinstance(self.kv_protocol_version, bool) or not isinstance(self.kv_protocol_version, int)
                or self.kv_protocol_version < 0):
            raise InvalidRequestError("kv_protocol_version", f"must be an int >= 0, got {self.kv_protocol_version!r}")
        if not isinstance(self.kv_events_endpoint, str):
            raise InvalidRequestError("kv_events_endpoint", f"must be a string, got {self.kv_events_endpoint!r}")
        if self.state not in STATES:
            raise InvalidRequestError("state", f"must be one of {STATES}, got {self.state!r}")


@dataclass(frozen=True)
class InstanceLoad:
    """Load of one instance at its last heartbeat."""

    queue_depth: int = 0
    num_running_requests: int = 0
    num_free_blocks: int = 0
    num_total_blocks: int = 0
    # The LoRA adapters it holds in memory now (a subset of InstanceInfo.lora_adapters' names,
    # sorted): gateways prefer these instances for the adapter's requests.
    resident_lora_adapters: tuple[str, ...] = ()
    # Of the running requests, those still without a first token (prompts being computed); the
    # others are decoding. Gateways shed load on queue_depth + num_prefilling of the prompt pool.
    num_prefilling: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.resident_lora_adapters, tuple) or not all(
                isinstance(name, str) for name in self.resident_lora_adapters):
            raise InvalidRequestError("resident_lora_adapters", f"must be a tuple of adapter names, "
                                                                f"got {self.resident_lora_adapters!r}")
        for field in _COUNT_FIELDS:
            value = getattr(self, field.name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise InvalidRequestError(field.name, f"must be an int >= 0, got {value!r}")
        if self.num_free_blocks > self.num_total_blocks:
            raise InvalidRequestError(
                "num_free_blocks",
                f"{self.num_free_blocks} exceeds num_total_blocks {self.num_total_blocks}",
            )


_COUNT_FIELDS = tuple(f for f in fields(InstanceLoad) if f.name != "resident_lora_adapters")
_NEWER_COUNT_FIELDS = ("num_prefilling",)  # may be absent from the records of older instances
_OPTIONAL_FIELDS = ("cache", "kv_tier_id", "pdserve_version", "kv_protocol_version", "lora_adapters", "state",
                    "kv_events_endpoint")
_IDENTITY_FIELDS = tuple(f.name for f in fields(InstanceInfo) if f.name not in _OPTIONAL_FIELDS)


def encode_instance(info: InstanceInfo, load: InstanceLoad) -> dict[str, str]:
    """Flat hash fields for one instance (every value a string)."""
    encoded = {name: str(getattr(info, name)) for name in _IDENTITY_FIELDS}
    encoded.update((f.name, str(getattr(load, f.name))) for f in _COUNT_FIELDS)
    encoded["resident_lora_adapters"] = json.dumps(list(load.resident_lora_adapters))
    if info.kv_tier_id:
        encoded["kv_tier_id"] = info.kv_tier_id
    encoded["pdserve_version"] = info.pdserve_version
    encoded["kv_protocol_version"] = str(info.kv_protocol_version)
    if info.cache is not None:
        encoded.update(encode_cache_settings(info.cache))
    encoded["lora_adapters"] = json.dumps(dict(info.lora_adapters), sort_keys=True)
    encoded["state"] = info.state
    if info.kv_events_endpoint:
        encoded["kv_events_endpoint"] = info.kv_events_endpoint
    return encoded


def decode_instance(hash_fields: dict[str, str]) -> tuple[InstanceInfo, InstanceLoad]:
    """Inverse of encode_instance. Raises KeyError/ValueError on a malformed hash."""
    adapters = json.loads(hash_fields.get("lora_adapters", "{}"))
    info = InstanceInfo(**{name: hash_fields[name] for name in _IDENTITY_FIELDS},
                        cache=decode_cache_settings(hash_fields), kv_tier_id=hash_fields.get("kv_tier_id", ""),
                        pdserve_version=hash_fields.get("pdserve_version", ""),
                        kv_protocol_version=int(hash_fields.get("kv_protocol_version", UNREGISTERED_PROTOCOL)),
                        lora_adapters=tuple(sorted((str(name), str(key)) for name, key in adapters.items())),
                        state=hash_fields.get("state", SERVING),
                        kv_events_endpoint=hash_fields.get("kv_events_endpoint", ""))
    resident = json.loads(hash_fields.get("resident_lora_adapters", "[]"))  # absent from older records
    counts = {f.name: int(hash_fields[f.name]) for f in _COUNT_FIELDS if f.name not in _NEWER_COUNT_FIELDS}
    # An instance of an older release reports no num_prefilling: count all its running
    # requests as prefilling, as gateways of that release did.
    counts["num_prefilling"] = int(hash_fields.get("num_prefilling", counts["num_running_requests"]))
    load = InstanceLoad(**counts, resident_lora_adapters=tuple(sorted(str(name) for name in resident)))
    return info, load
