"""A reservation's life, one test per transition of shared.core.remote_kv (reserve, transfer ok,
transfer failed, renew, start, compute locally, time out, release, crash), on the scheduler
alone: a hand-driven clock, and a connector that records whether it is armed for a request.
The transfers' outcomes are fed in as the connector would report them."""

import asyncio
import math

import pytest

from services.decode.leases import ReservationLeases
from shared.cluster.leases import LeaseTable
from shared.core.kv_cache_manager import KVCacheManager
from shared.core.remote_kv import TRANSITIONS, InvalidTransition, RemoteKV, RemoteKVEvent, RemoteKVState
from shared.core.request import Request, RequestStatus
from shared.core.scheduler import Scheduler
from shared.core.scheduler_config import SchedulerConfig
from shared.engine_api.client import GenerateRequest, KVReservation
from shared.errors import InvalidRequestError
from shared.kv_cache.block_pool import BlockPool
from shared.kv_transfer.base import KVConnector
from shared.kv_transfer.types import FinishedTransfers, KVConnectorRole, KVTransferConfig
from shared.sampling.params import SamplingParams

BLOCK_SIZE = 4
NUM_BLOCKS = 8
PROMPT = list(range(10, 20))  # 10 tokens: 3 blocks
TOKEN = b"\x01" * 16
S = RemoteKVState


class RecordingConnector(KVConnector):
    """Armed for a request from `update_state_after_alloc` until `cancel`."""

    def __init__(self):
        super().__init__(KVTransferConfig("test", KVConnectorRole.CONSUMER), kv_access=None)
        self.armed: dict[str, list[int]] = {}

    def update_state_after_alloc(self, request_id, block_ids, num_external_tokens, transfer_token, adapter_key=""):
        self.armed[request_id] = list(block_ids)

    def request_finished(self, request_id, block_ids, send) -> bool:
        return False

    def cancel(self, request_id: str) -> None:
        self.armed.pop(request_id, None)

    def get_finished(self) -> FinishedTransfers:
        return FinishedTransfers((), ())


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def make_scheduler(prefix_caching=False) -> tuple[Scheduler, RecordingConnector, Clock]:
    connector, clock = RecordingConnector(), Clock()
    kv = KVCacheManager(BlockPool(NUM_BLOCKS), BLOCK_SIZE, prefix_caching)
    config = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=64)
    return Scheduler(config, kv, max_model_len=1024, connector=connector, clock=clock), connector, clock


def reserve(scheduler: Scheduler, request_id="r", ttl_s: float | None = 5.0, prompt=PROMPT) -> Request:
    request = Request(request_id, list(prompt), SamplingParams(max_tokens=4), eos_token_ids=(0,), max_output_tokens=4)
    assert scheduler.admit_with_remote_kv(request, TOKEN, ttl_s)
    return request


def assert_freed(scheduler: Scheduler, connector: RecordingConnector, request_id: str) -> None:
    assert request_id not in scheduler.waiting_for_remote_kv and request_id not in scheduler.requests
    assert request_id not in connector.armed
    assert scheduler.kv.pool.num_free_blocks == NUM_BLOCKS


def test_reserve_allocates_arms_the_connector_and_sets_the_deadline():
    scheduler, connector, clock = make_scheduler()
    request = reserve(scheduler, ttl_s=5.0)
    assert request.remote_kv == RemoteKV(deadline=105.0, state=S.AWAITING_KV)
    assert request.status == RequestStatus.WAITING_FOR_REMOTE_KV
    assert connector.armed["r"] == scheduler.kv.block_ids("r") and len(connector.armed["r"]) == 3
    assert scheduler.seconds_to_next_deadline() == 5.0
    assert reserve(scheduler, "forever", ttl_s=None).remote_kv.deadline == math.inf


def test_reserve_without_room_changes_nothing():
    scheduler, connector, _ = make_scheduler()
    too_long = Request("big", list(range(NUM_BLOCKS * BLOCK_SIZE + 1)), SamplingParams(max_tokens=1))
    assert not scheduler.admit_with_remote_kv(too_long, TOKEN, 5.0)
    assert too_long.remote_kv is None and not connector.armed and not scheduler.waiting_for_remote_kv
    assert scheduler.seconds_to_next_deadline() == math.inf


def test_transfer_ok_arrives_and_a_second_copy_is_accepted_too():
    scheduler, _, _ = make_scheduler()
    request = reserve(scheduler)
    assert scheduler.on_remote_kv_transfer("r", None) is request and request.remote_kv.state == S.ARRIVED
    assert scheduler.on_remote_kv_transfer("r", None) is request and request.remote_kv.state == S.ARRIVED
    assert request.remote_kv.num_failed_transfers == 0


def test_transfer_failed_counts_and_undoes_an_earlier_arrival():
    scheduler, connector, _ = make_scheduler()
    request = reserve(scheduler)
    scheduler.on_remote_kv_transfer("r", "connection: lost")
    assert (request.remote_kv.state, request.remote_kv.num_failed_transfers) == (S.AWAITING_KV, 1)
    scheduler.on_remote_kv_transfer("r", None)
    scheduler.on_remote_kv_transfer("r", "chunk_crc32: mismatch")  # may have overwritten part of it
    assert (request.remote_kv.state, request.remote_kv.num_failed_transfers) == (S.AWAITING_KV, 2)
    assert "r" in connector.armed  # a retry is still accepted


def test_renew_moves_the_deadline_in_either_waiting_state():
    scheduler, _, clock = make_scheduler()
    request = reserve(scheduler, ttl_s=5.0)
    clock.now = 104.0
    assert scheduler.renew_remote_kv("r", 5.0) and request.remote_kv.deadline == 109.0
    scheduler.on_remote_kv_transfer("r", None)
    clock.now = 108.0
    assert scheduler.renew_remote_kv("r", 2.0) and request.remote_kv.deadline == 110.0
    assert request.remote_kv.state == S.ARRIVED
    assert not scheduler.renew_remote_kv("never", 5.0)


def test_start_needs_the_kv_and_then_decodes_from_the_first_token():
    scheduler, connector, _ = make_scheduler()
    request = reserve(scheduler)
    scheduler.on_remote_kv_transfer("r", "connection: lost")
    with pytest.raises(InvalidRequestError, match=r"has not arrived \(1 failed transfers\)"):
        scheduler.start_after_remote_kv("r", 42)
    assert request.remote_kv.state == S.AWAITING_KV and "r" in scheduler.waiting_for_remote_kv
    scheduler.on_remote_kv_transfer("r", None)
    assert scheduler.start_after_remote_kv("r", 42) is request
    assert request.remote_kv.state == S.STARTED and request.status == RequestStatus.RUNNING
    assert request.output_token_ids == [42] and request.num_computed_tokens == len(PROMPT)
    assert "r" not in connector.armed and "r" not in scheduler.waiting_for_remote_kv
    assert scheduler.on_remote_kv_transfer("r", None) is None  # a late outcome is ignored
    with pytest.raises(InvalidRequestError, match="has no reservation"):
        scheduler.start_after_remote_kv("r", 42)


def test_compute_locally_runs_the_prompt_here_from_either_waiting_state():
    scheduler, connector, _ = make_scheduler()
    awaiting, arrived = reserve(scheduler, "a"), reserve(scheduler, "b")
    scheduler.on_remote_kv_transfer("b", None)
    for request in (awaiting, arrived):
        assert scheduler.compute_reserved(request.request_id) is request
        assert request.remote_kv.state == S.COMPUTING and request.status == RequestStatus.RUNNING
        assert request.num_computed_tokens == request.num_cached_prompt_tokens == 0
    assert not connector.armed and not scheduler.waiting_for_remote_kv
    assert [item.request_id for item in scheduler.schedule().scheduled] == ["a", "b"]


def test_time_out_frees_the_reservation_exactly_at_its_deadline():
    scheduler, connector, clock = make_scheduler()
    request = reserve(scheduler, ttl_s=5.0)
    scheduler.on_remote_kv_transfer("r", None)  # an arrived reservation times out too
    clock.now = 104.999
    assert scheduler.expire_remote_kv() == [] and request.remote_kv.state == S.ARRIVED
    clock.now = 105.0
    assert scheduler.seconds_to_next_deadline() == 0.0
    assert scheduler.expire_remote_kv() == [request]
    assert request.remote_kv.state == S.EXPIRED and request.status == RequestStatus.FINISHED_ABORTED
    assert_freed(scheduler, connector, "r")
    assert scheduler.expire_remote_kv() == [] and not scheduler.renew_remote_kv("r", 5.0)


def test_release_frees_the_reservation_and_an_abort_is_a_release():
    scheduler, connector, _ = make_scheduler()
    released, aborted = reserve(scheduler, "a"), reserve(scheduler, "b", ttl_s=None)
    assert scheduler.release_remote_kv("a") and not scheduler.release_remote_kv("a")
    scheduler.abort(["b"])
    for request in (released, aborted):
        assert request.remote_kv.state == S.RELEASED
    assert_freed(scheduler, connector, "a")
    assert_freed(scheduler, connector, "b")


def test_release_keeping_what_arrived_leaves_it_in_the_prefix_cache():
    scheduler, connector, _ = make_scheduler(prefix_caching=True)
    prompt = list(range(10, 22))  # 3 full blocks
    reserve(scheduler, "pull", ttl_s=None, prompt=prompt)
    scheduler.on_remote_kv_transfer("pull", None)
    assert scheduler.release_remote_kv("pull", keep_arrived=True)
    assert_freed(scheduler, connector, "pull")
    later = reserve(scheduler, "later", prompt=prompt + [99])
    assert later.num_cached_prompt_tokens == len(prompt)


@pytest.mark.parametrize("state", list(RemoteKVState))
@pytest.mark.parametrize("event", list(RemoteKVEvent))
def test_every_pair_not_in_the_table_is_refused(state, event):
    remote_kv = RemoteKV(state=state)
    if (state, event) in TRANSITIONS:
        assert remote_kv.apply(event) == TRANSITIONS[state, event]
    else:
        with pytest.raises(InvalidTransition, match=state.value):
            remote_kv.apply(event)
        assert remote_kv.state == state


def test_the_ended_states_take_no_event():
    ended = {state for state in RemoteKVState if not state.is_waiting}
    assert ended == {S.STARTED, S.COMPUTING, S.EXPIRED, S.RELEASED}
    assert not [pair for pair in TRANSITIONS if pair[0] in ended]


class DeadEngine:
    """An engine client whose core died holding reservations (only what the leases call)."""

    on_reservation_event = None

    async def reserve_kv(self, request: GenerateRequest, lease_s: float | None = None) -> KVReservation:
        return KVReservation(request.request_id, (1, 2), 0, 0, "memory:0", TOKEN)


def test_crash_drops_every_lease_with_the_engine():
    async def scenario():
        table = LeaseTable("d0")
        leases = ReservationLeases(DeadEngine(), table)
        await leases.reserve(GenerateRequest("a", (1, 2, 3), SamplingParams()), 5.0)
        with pytest.raises(InvalidRequestError, match="already reserved"):
            await leases.reserve(GenerateRequest("a", (1, 2, 3), SamplingParams()), 5.0)
        leases.forget_all()
        assert len(leases) == len(table) == 0 and leases.num_lease_expiries == 0
    asyncio.run(scenario())
