"""Peer reuse, the puller's side: before a prompt runs, pull the leading blocks another instance
holds (the gateway's PrefillRequest.peer_source) over UCX instead of computing them, when that
is measured cheaper.

    1. Decide: loading the blocks this instance lacks from the peer (a fixed round trip plus
       seconds per block) against computing their tokens here (seconds per prompt token, as
       this instance's own prompts took lately: the current load included). Logged and
       counted either way.
    2. Reserve the prefix in the engine (its own prefix hits, from the pool or the host tier,
       are not pulled), ask the holder to send the rest (SendCachedBlocks), wait for the KV.
    3. Keep the arrived blocks as prefix-cache entries and release the reservation; the prompt
       then runs and finds them as hits.

Anything that goes wrong (the holder refuses, dies, hangs past --kv-peer-timeout-s, the
transfer fails a checksum) releases the reservation without keeping anything, and the prompt
is computed here: slower, never wrong, nothing left reserved.
"""

import asyncio
import logging
import time

import grpc

from shared.engine_api.client import CapacityError, GenerateRequest, KVTierStats, KVTransferFailedError
from shared.kv_tier.cost import CostModel
from shared.kv_tier.cost_seeds import load_cost_seeds
from shared.kv_tier.stats import TierCounters
from shared.pb.pdserve.v1 import instance_pb2 as pb, instance_pb2_grpc
from shared.sampling.params import SamplingParams
from services.rpc.message_limits import message_size_options
from services.rpc.tracing_interceptors import client_interceptors
from services.tls.credentials import channel_credentials

logger = logging.getLogger(__name__)

PULL_ID_SUFFIX = ":pull"
# Until measured: the fixed cost of a pull (two engine calls and an RPC) and per block (~360 KiB
# of SmolLM2 bf16 KV over loopback UCX at ~0.7 GB/s), and a prompt token's compute on this CPU.
DEFAULT_PEER_FIXED_S = 0.01
DEFAULT_PEER_PER_BLOCK_S = 5e-4
DEFAULT_COMPUTE_PER_TOKEN_S = 8e-4


class PeerPuller:
    def __init__(self, runtime):
        settings = runtime.settings
        self.runtime = runtime
        self.is_enabled = settings.kv_peer_reuse
        self.timeout_s = settings.kv_peer_timeout_s
        self.counters = TierCounters("peer")
        self.cost = _cost_model(settings.kv_cost_profile)
        self.num_in_flight = 0
        self._credentials = (channel_credentials(settings.tls_ca_file, settings.tls_cert_file, settings.tls_key_file)
                             if settings.tls_cert_file and settings.tls_ca_file else None)
        self._stubs: dict[str, instance_pb2_grpc.InstanceStub] = {}
        self._channels: list[grpc.aio.Channel] = []

    async def close(self) -> None:
        for channel in self._channels:
            await channel.close()
        self._channels.clear()
        self._stubs.clear()

    def stats(self) -> KVTierStats:
        return self.counters.frozen()

    def record_prompt(self, num_computed_tokens: int, seconds: float) -> None:
        """A prompt of this instance computed that many tokens in `seconds` (queueing included:
        the cost of computing here now)."""
        self.cost.record_compute(num_computed_tokens, seconds)

    # ---- one pull ------------------------------------------------------------------------------

    async def pull(self, request: pb.PrefillRequest) -> int:
        """Pull the prompt's leading blocks from the peer the gateway named, if worth it; the
        prompt tokens now in this instance's prefix cache thanks to it (0: none pulled)."""
        if not self.is_enabled or not request.HasField("peer_source"):
            return 0
        source, block_size = request.peer_source, self.runtime.engine.info.cache.block_size
        num_blocks = min(source.num_blocks, (len(request.prompt_token_ids) - 1) // block_size)
        num_missing = num_blocks - source.num_local_blocks
        if num_missing <= 0 or not self._decide(request.request_id, source, num_missing, block_size):
            return 0
        self.num_in_flight += 1
        timer = _PullTimer()
        try:
            num_pulled = await self._pull_blocks(request, source, num_blocks * block_size, timer)
        finally:
            self.num_in_flight -= 1
        if num_pulled:
            self.counters.num_hits += num_pulled
            self.counters.num_loads += num_pulled
            self.counters.load_seconds += timer.total_s
            self.counters.recompute_avoided_tokens += num_pulled * block_size
            self.cost.record_load("peer", num_pulled, timer.total_s, fixed_seconds=timer.fixed_s)
        return num_pulled * block_size

    def _decide(self, request_id: str, source: pb.PeerSource, num_missing: int, block_size: int) -> bool:
        decision = self.cost.decide({"peer": num_missing}, block_size)
        if decision.load:
            self.counters.num_load_decisions += 1
        else:
            self.counters.num_recompute_decisions += 1
        logger.info("prefill %s: %s %d blocks %s %s (pull %.1f ms, compute %.1f ms)", request_id,
                    "pulling" if decision.load else "computing", num_missing,
                    "from" if decision.load else "rather than pulling them from", source.instance_id,
                    decision.load_seconds * 1e3, decision.recompute_seconds * 1e3)
        return decision.load

    async def _pull_blocks(self, request: pb.PrefillRequest, source: pb.PeerSource, num_tokens: int,
                           timer: "_PullTimer") -> int:
        """Reserve, have the holder send, keep what arrived; the blocks pulled (0 after a failure)."""
        engine, pull_id = self.runtime.engine, request.request_id + PULL_ID_SUFFIX
        salt = request.cache_salt if request.HasField("cache_salt") else None
        prefix = tuple(request.prompt_token_ids[:num_tokens])
        try:
            reservation = await engine.reserve_kv(GenerateRequest(pull_id, prefix, SamplingParams(max_tokens=1), salt))
        except CapacityError as error:
            self._failed(request.request_id, source, num_tokens // block_size_of(engine),
                         f"no room to reserve the prefix ({error})")
            return 0
        keep = False
        try:
            async with asyncio.timeout(self.timeout_s):
                await self._stub(source.grpc_address).SendCachedBlocks(pb.SendCachedBlocksRequest(
                    request_id=pull_id, prompt_token_ids=prefix, cache_salt=salt,
                    num_skip_blocks=reservation.num_skip_blocks, ucx_address=reservation.transfer_address,
                    dst_block_ids=reservation.block_ids, transfer_token=reservation.transfer_token))
                timer.asked()
                await engine.wait_kv(pull_id)
                timer.arrived()
            keep = True
        except (grpc.aio.AioRpcError, KVTransferFailedError, TimeoutError) as error:
            self._failed(request.request_id, source, len(reservation.block_ids) - reservation.num_skip_blocks,
                         _describe(error))
        finally:
            await engine.release_kv(pull_id, keep_arrived=keep)
            timer.released()
        return len(reservation.block_ids) - reservation.num_skip_blocks if keep else 0

    def _failed(self, request_id: str, source: pb.PeerSource, num_blocks: int, why: str) -> None:
        """A pull that brought nothing: its blocks count as misses (computed here instead)."""
        self.counters.num_misses += num_blocks
        logger.warning("prefill %s: pulling from %s failed (%s); computing the prompt here", request_id,
                       source.instance_id, why)

    def _stub(self, address: str) -> instance_pb2_grpc.InstanceStub:
        if address not in self._stubs:
            options = message_size_options()
            interceptors = client_interceptors()
            channel = (grpc.aio.insecure_channel(address, options=options, interceptors=interceptors)
                       if self._credentials is None
                       else grpc.aio.secure_channel(address, self._credentials, options=options,
                                                    interceptors=interceptors))
            self._channels.append(channel)
            self._stubs[address] = instance_pb2_grpc.InstanceStub(channel)
        return self._stubs[address]


class _PullTimer:
    """A pull's phases: until the holder answered (reservation and round trip), the blocks'
    arrival, the release. The first and last do not depend on the number of blocks."""

    def __init__(self):
        self._started = time.perf_counter()
        self._asked = self._arrived = self._released = self._started

    def asked(self) -> None:
        self._asked = time.perf_counter()

    def arrived(self) -> None:
        self._arrived = time.perf_counter()

    def released(self) -> None:
        self._released = time.perf_counter()

    @property
    def total_s(self) -> float:
        return self._released - self._started

    @property
    def fixed_s(self) -> float:
        return (self._asked - self._started) + (self._released - self._arrived)


def _cost_model(profile: str) -> CostModel:
    fixed, per_block, per_token = DEFAULT_PEER_FIXED_S, DEFAULT_PEER_PER_BLOCK_S, DEFAULT_COMPUTE_PER_TOKEN_S
    if profile:
        seeds = load_cost_seeds(profile)
        if "peer" in seeds.tiers:
            fixed, per_block = seeds.tiers["peer"].fixed_seconds, seeds.tiers["peer"].seconds_per_block
        per_token = seeds.compute_seconds_per_token or per_token
    return CostModel({"peer": per_block}, per_token, fixed_load_seconds={"peer": fixed})


def block_size_of(engine) -> int:
    return engine.info.cache.block_size


def _describe(error: BaseException) -> str:
    if isinstance(error, grpc.aio.AioRpcError):
        return f"{error.code().name}: {error.details()}"
    if isinstance(error, TimeoutError):
        return "no KV within the peer timeout"
    return str(error)
