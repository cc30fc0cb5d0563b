"""Gateway counters (plain numbers, for logs now and a metrics endpoint later)."""

from collections import Counter
from dataclasses import dataclass, field

from services.gateway.unknown_fields import UnknownFields


@dataclass
class GatewayStats:
    num_requests: int = 0
    num_completed: int = 0
    num_cancelled: int = 0
    # Final status code name -> requests that ended with it (e.g. "RESOURCE_EXHAUSTED").
    failures: Counter = field(default_factory=Counter)
    # "<role>:<reason>" -> decisions, e.g. "decode:prefix", "prefill:load", "colocated:only".
    routing: Counter = field(default_factory=Counter)
    num_prefill_retries: int = 0  # prefill attempts after a failed one
    num_decode_refusals: int = 0  # Reserve answered RESOURCE_EXHAUSTED
    num_decode_failovers: int = 0  # Reserve failed otherwise (instance unreachable)
    num_reserve_rounds_repeated: int = 0  # no decode instance answered: all tried once more
    num_colocated_failovers: int = 0
    num_releases: int = 0  # reservations given back because Decode never started
    num_lease_renewals: int = 0  # Renew calls that extended a reservation while prefill ran
    # Hung instances (services.gateway.stall_watch): health probes of stalled streams, and the
    # instances found hung by them or by a control call past its timeout, by role.
    num_stall_probes: int = 0
    hung_instances: Counter = field(default_factory=Counter)
    # HTTP request fields this server does not know, by endpoint and name.
    unknown_fields: UnknownFields = field(default_factory=UnknownFields)
    # Reason ("failure": the decode instance died; "drain": it was draining; "hung": it stopped
    # answering) -> streams moved
    # mid-way to another decode instance.
    migrations: Counter = field(default_factory=Counter)
    # (where, reason) -> prefill placements (services.gateway.placement), e.g.
    # ("decode_local", "short_prompt"), ("prefill_pool", "decode_refused").
    placements: Counter = field(default_factory=Counter)

    def record_route(self, role: str, reason: str) -> None:
        self.routing[f"{role}:{reason}"] += 1

    def record_failure(self, code_name: str) -> None:
        self.failures[code_name] += 1
