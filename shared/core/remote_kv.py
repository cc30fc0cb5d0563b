"""A reservation's life: a request whose prompt KV arrives from another engine (decode role, or
a peer pull), from Reserve until it starts, times out or is released. The scheduler owns it
(`Scheduler.waiting_for_remote_kv` holds the requests, each `Request.remote_kv` its state);
nothing above the engine keeps a copy: the KV connector only reports finished transfers, the
engine client only passes the events below to whoever waits, and the decode service only keeps
the lease that the gateway renews (and its mirror in Redis).

                              reserve(ttl)
                                   |
        transfer failed            v             transfer ok
      +-----------------> +-------------+ ------------------> +---------+ ---+ transfer ok
      | (failures += 1)   | AWAITING_KV |                     | ARRIVED |    | (a retried
      +------------------ +-------------+ <------------------ +---------+ <--+  prefill's copy)
                                            transfer failed        |
         renew(ttl) moves the deadline      (arrival undone,       | start (first token)
         in either state                     failures += 1)        v
                                                              +---------+
                                                              | STARTED |  decodes
                                                              +---------+
      from AWAITING_KV or ARRIVED:
        time out (deadline passed) ---> EXPIRED    blocks freed
        release ----------------------> RELEASED   blocks freed (a peer pull caches what arrived)
        compute locally --------------> COMPUTING  the prompt is computed here
      from any state:
        crash: the engine dies, and every reservation with it (nothing is left to free);
        the decode service drops its leases (services.decode.leases)

| event             | from                  | to          | effect                                     |
|-------------------|-----------------------|-------------|--------------------------------------------|
| reserve(ttl)      | (new)                 | AWAITING_KV | blocks allocated, connector armed,         |
|                   |                       |             | deadline = now + ttl (None: no deadline)   |
| transfer ok       | AWAITING_KV, ARRIVED  | ARRIVED     | received blocks committed                  |
| transfer failed   | AWAITING_KV, ARRIVED  | AWAITING_KV | failures += 1; an earlier arrival undone   |
|                   |                       |             | (the failed one may have overwritten part) |
| renew(ttl)        | AWAITING_KV, ARRIVED  | (same)      | deadline = now + ttl                       |
| start             | ARRIVED               | STARTED     | connector disarmed; decodes from the       |
|                   |                       |             | producer's first token                     |
| compute locally   | AWAITING_KV, ARRIVED  | COMPUTING   | connector disarmed; the prompt is computed |
|                   |                       |             | here from the local prefix-cache hits on   |
| time out          | AWAITING_KV, ARRIVED  | EXPIRED     | connector disarmed; blocks freed           |
| release           | AWAITING_KV, ARRIVED  | RELEASED    | connector disarmed; blocks freed           |
| crash             | any                   | (gone)      | the engine and its blocks are gone         |

The connector stays armed in ARRIVED: a prefill that died after its transfer but before
answering the gateway is retried elsewhere, and that copy must be accepted too; a transfer
superseded by a newer one for the same reservation writes no more (shared.kv_transfer.ucx.receiver).
Any other (state, event) pair is refused (`InvalidTransition`); an outcome reported for a
reservation that already ended is ignored by the scheduler (the connector was disarmed).
"""

import enum
import math
from dataclasses import dataclass


class RemoteKVState(enum.Enum):
    AWAITING_KV = "awaiting_kv"
    ARRIVED = "arrived"
    STARTED = "started"
    COMPUTING = "computing"
    EXPIRED = "expired"
    RELEASED = "released"

    @property
    def is_waiting(self) -> bool:
        """Still held for its KV (the scheduler's `waiting_for_remote_kv`)."""
        return self in (RemoteKVState.AWAITING_KV, RemoteKVState.ARRIVED)


class RemoteKVEvent(enum.Enum):
    TRANSFER_OK = "transfer ok"
    TRANSFER_FAILED = "transfer failed"
    RENEW = "renew"
    START = "start"
    COMPUTE_LOCALLY = "compute locally"
    TIME_OUT = "time out"
    RELEASE = "release"


_WAITING = (RemoteKVState.AWAITING_KV, RemoteKVState.ARRIVED)

# (state, event) -> next state; the table in the module docstring, as data.
TRANSITIONS: dict[tuple[RemoteKVState, RemoteKVEvent], RemoteKVState] = {
    **{(state, RemoteKVEvent.TRANSFER_OK): RemoteKVState.ARRIVED for state in _WAITING},
    **{(state, RemoteKVEvent.TRANSFER_FAILED): RemoteKVState.AWAITING_KV for state in _WAITING},
    **{(state, RemoteKVEvent.RENEW): state for state in _WAITING},
    (RemoteKVState.ARRIVED, RemoteKVEvent.START): RemoteKVState.STARTED,
    **{(state, RemoteKVEvent.COMPUTE_LOCALLY): RemoteKVState.COMPUTING for state in _WAITING},
    **{(state, RemoteKVEvent.TIME_OUT): RemoteKVState.EXPIRED for state in _WAITING},
    **{(state, RemoteKVEvent.RELEASE): RemoteKVState.RELEASED for state in _WAITING},
}


class InvalidTransition(Exception):
    def __init__(self, state: RemoteKVState, event: RemoteKVEvent):
        super().__init__(f"a reservation in state {state.value} cannot take the event {event.value!r}")
        self.state = state
        self.event = event


@dataclass
class RemoteKV:
    """One reservation's state; `deadline` is on the scheduler's clock (math.inf: none)."""

    deadline: float = math.inf
    state: RemoteKVState = RemoteKVState.AWAITING_KV
    num_failed_transfers: int = 0

    def apply(self, event: RemoteKVEvent) -> RemoteKVState:
        """Take one event (InvalidTransition if the table has no such edge); the new state."""
        next_state = TRANSITIONS.get((self.state, event))
        if next_state is None:
            raise InvalidTransition(self.state, event)
        if event == RemoteKVEvent.TRANSFER_FAILED:
            self.num_failed_transfers += 1
        self.state = next_state
        return next_state

    def is_due(self, now: float) -> bool:
        """Whether its deadline has passed (a waiting reservation then times out)."""
        return self.state.is_waiting and now >= self.deadline


def deadline_after(now: float, ttl_s: float | None) -> float:
    """The deadline `ttl_s` from `now`; None or 0: no deadline (a caller that always releases)."""
    return now + ttl_s if ttl_s else math.inf
