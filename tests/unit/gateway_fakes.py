"""Fake engine instances for gateway tests: grpc.aio servers on port 0 that implement the
Instance service with canned behaviour, registered in a real Redis."""

import asyncio
from dataclasses import dataclass, field

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from shared.cluster.instances import InstanceInfo, InstanceLoad, InstanceRegistry
from shared.cluster.prefix_index import PrefixIndex
from shared.engine_api.client import CacheSettings
from shared.errors import REQUEST_FAILED_METADATA_KEY
from shared.pb.pdserve.v1 import generation_pb2 as gen, instance_pb2 as inst, instance_pb2_grpc
from shared.wire.handback import handed_back_message, handed_back_trailer

# Gateway settings that keep every prompt on the prefill pool (no conditional disaggregation):
# the fixtures' default, so that short test prompts take the path their tests are about.
POOL_ONLY = {"local_prefill_max_tokens": 0, "local_prefill_busy_max_tokens": 0}

FIRST_TOKEN_ID = 42
DECODE_PIECES = (("Hello", [42]), (" world", [43]), ("!", [44]))
FAKE_BLOCK_SIZE = 16


def fake_logprobs(token_id: int) -> gen.PositionLogprobs:
    """The fakes' logprobs of a generated token: -0.5, with token 7 the alternative at -1.5."""
    return gen.PositionLogprobs(token_id=token_id, logprob=-0.5, top=[gen.TokenLogprob(token_id=token_id, logprob=-0.5),
                                                                       gen.TokenLogprob(token_id=7, logprob=-1.5)])


def fake_cache_settings(model_id: str, **changes) -> CacheSettings:
    """What a fake instance registers: like a real SmolLM2 instance's, with `changes`."""
    values = dict(model_id=model_id, block_size=FAKE_BLOCK_SIZE, prefix_hash_algo="sha256", dtype="bfloat16",
                  kv_layout="kv,layer,block,slot,kv_head,head_dim;layers=30;kv_heads=3;head_dim=64")
    return CacheSettings(**{**values, **changes})


@dataclass
class Behaviour:
    reserve_error: grpc.StatusCode | None = None
    reserve_blocks: bool = False  # Reserve waits until cancelled (a busy decode instance)
    num_reserves_unanswered: int = 0  # so many Reserve calls wait until cancelled, later ones answer
    num_reserves_refused: int = 0  # so many Reserve calls are refused for room, later ones answer
    prefill_error: grpc.StatusCode | None = None
    prefill_request_failed: bool = False  # Prefill answers INTERNAL marked as the request's own failure
    prefill_blocks: bool = False  # Prefill waits until cancelled
    prefill_blocks_toward: str = ""  # Prefill toward this UCX address waits until cancelled (a stopped receiver)
    prefill_fails_toward: str = ""  # Prefill toward this UCX address fails (ABORTED): a dead decode
    prefill_delay_s: float = 0.0  # Prefill answers after this long (a queued prompt)
    # StreamPrefill: after its first token, wait for this event before the outcome (the KV in flight).
    prefill_holds_outcome: asyncio.Event | None = None
    prefill_fails_after_first_token: int = 0  # so many StreamPrefill calls send their first token, then die
    prefill_first_token_ends: bool = False  # the completion ends with the first token (EOS)
    local_prefill_refused: bool = False  # PrefillLocally answers RESOURCE_EXHAUSTED
    # The first token StreamPrefill samples (id, text): the fake decode streams the same first.
    first_token: tuple[int, str] = (FIRST_TOKEN_ID, DECODE_PIECES[0][0])
    decode_blocks_after_first: bool = False  # Decode sends one message, then waits
    decode_error: grpc.StatusCode | None = None  # Decode fails at once with this code
    # Decode sends one message, turns NOT_SERVING and fails the call (a decode draining away).
    decode_drains_after_first: bool = False
    num_cached_prompt_tokens: int = 0  # reported by Reserve (decode) and Prefill
    # Reported by Reserve; None: num_cached_prompt_tokens // the registered block size.
    num_skip_blocks: int | None = None
    block_ids: list[int] = field(default_factory=lambda: [7, 8, 9, 10])


class FakeInstance(instance_pb2_grpc.InstanceServicer):
    def __init__(self, instance_id: str, role: str, behaviour: Behaviour | None = None,
                 versions: dict[str, object] | None = None, **cache_changes):
        self.instance_id = instance_id
        self.role = role
        self.behaviour = behaviour or Behaviour()
        self.versions = versions or {}  # registered pdserve_version / kv_protocol_version (default: current)
        self.cache_changes = cache_changes  # registered cache settings that differ from the usual
        self.block_size = cache_changes.get("block_size", FAKE_BLOCK_SIZE)
        self.calls: list[tuple[str, object]] = []  # (method, request message)
        self.cancelled = asyncio.Event()  # a call of ours saw the client cancel
        self.started = asyncio.Event()  # Prefill or Decode began
        self.waiting = asyncio.Event()  # a call of ours waits until cancelled
        self.is_hung = False  # health probes go unanswered (a SIGSTOPped process); see hang()
        self.num_health_checks = 0
        self.server: grpc.aio.Server | None = None
        self.address = ""

    def methods(self) -> list[str]:
        return [method for method, _ in self.calls]

    def requests_of(self, method: str) -> list:
        return [request for name, request in self.calls if name == method]

    async def start(self) -> None:
        self.server = grpc.aio.server()
        instance_pb2_grpc.add_InstanceServicer_to_server(self, self.server)
        self.health = _HangableHealth(self)  # SERVING by default, like a live instance
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        port = self.server.add_insecure_port("127.0.0.1:0")
        await self.server.start()
        self.address = f"127.0.0.1:{port}"

    async def stop(self) -> None:
        await self.server.stop(0)

    async def set_serving(self, is_serving: bool) -> None:
        status = health_pb2.HealthCheckResponse.SERVING if is_serving else health_pb2.HealthCheckResponse.NOT_SERVING
        await self.health.set("", status)

    def hang(self) -> None:
        """Leave health probes unanswered from now on; combine with Behaviour's blocking flags
        (reserve_blocks, prefill_blocks, decode_blocks_after_first) for calls that never answer."""
        self.is_hung = True

    async def Reserve(self, request, context):
        self.calls.append(("Reserve", request))
        if self.behaviour.reserve_error is not None:
            await context.abort(self.behaviour.reserve_error, f"{self.instance_id} says no")
        if self.behaviour.num_reserves_refused > 0:
            self.behaviour.num_reserves_refused -= 1
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, f"{self.instance_id}: no room")
        if self.behaviour.num_reserves_unanswered > 0:
            self.behaviour.num_reserves_unanswered -= 1
            await self._wait_for_cancel()
        if self.behaviour.reserve_blocks:
            await self._wait_for_cancel()
        num_cached = self.behaviour.num_cached_prompt_tokens
        num_skip = self.behaviour.num_skip_blocks
        return inst.ReserveResponse(ucx_address=f"ucx-{self.instance_id}", block_ids=self.behaviour.block_ids,
                                    num_cached_prompt_tokens=num_cached,
                                    num_skip_blocks=num_cached // self.block_size if num_skip is None else num_skip)

    async def StreamPrefill(self, request, context):
        self.calls.append(("StreamPrefill", request))
        self.started.set()
        await self._prefill_failures(request, context)
        prompt_logprobs = [gen.PositionLogprobs(token_id=t, logprob=-1.0) for t in request.prompt_token_ids[1:]]
        token_id, text = self.behaviour.first_token
        if request.decode_ucx_address:  # the token comes before the outcome only when KV is sent
            first = inst.FirstToken(token_id=token_id, text=text, prompt_logprobs=prompt_logprobs)
            if request.sampling.HasField("logprobs"):
                first.logprobs.CopyFrom(fake_logprobs(token_id))
            yield inst.PrefillEvent(first_token=first)
        if self.behaviour.prefill_fails_after_first_token > 0:
            self.behaviour.prefill_fails_after_first_token -= 1
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"{self.instance_id} died after its first token")
        if self.behaviour.prefill_holds_outcome is not None:
            await self._wait_for(self.behaviour.prefill_holds_outcome)
        await asyncio.sleep(self.behaviour.prefill_delay_s)
        done = inst.PrefillResponse(
            first_token_id=token_id, num_computed_prompt_tokens=len(request.prompt_token_ids),
            num_cached_prompt_tokens=self.behaviour.num_cached_prompt_tokens)
        if not request.decode_ucx_address:
            done.prompt_logprobs.extend(prompt_logprobs)
        if self.behaviour.prefill_first_token_ends:
            done.finish_reason, done.final_text = gen.FINISH_REASON_STOP, "?"
        yield inst.PrefillEvent(done=done)

    async def _prefill_failures(self, request, context) -> None:
        if self.behaviour.prefill_error is not None:
            await context.abort(self.behaviour.prefill_error, f"{self.instance_id} broke")
        if self.behaviour.prefill_fails_toward and request.decode_ucx_address == self.behaviour.prefill_fails_toward:
            await context.abort(grpc.StatusCode.ABORTED, f"KV transfer to {request.decode_ucx_address} failed")
        if self.behaviour.prefill_request_failed:
            await context.abort(grpc.StatusCode.INTERNAL, "request failed in the engine: sampling failed",
                                trailing_metadata=((REQUEST_FAILED_METADATA_KEY, "1"),))
        blocks_toward = self.behaviour.prefill_blocks_toward
        if self.behaviour.prefill_blocks or (blocks_toward and request.decode_ucx_address == blocks_toward):
            await self._wait_for_cancel()

    async def PrefillLocally(self, request, context):
        self.calls.append(("PrefillLocally", request))
        self.started.set()
        if self.behaviour.local_prefill_refused:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, f"{self.instance_id}: no room to prefill here")
        async for message in self.Decode(request, context, record=False):
            yield message

    async def Decode(self, request, context, record: bool = True):
        if record:
            self.calls.append(("Decode", request))
        self.started.set()
        if self.behaviour.decode_error is not None:
            await context.abort(self.behaviour.decode_error, f"{self.instance_id}: no reservation for it")
        for position, (text, token_ids) in enumerate(DECODE_PIECES):
            message = gen.GenerateResponse(request_id=request.request_id, text=text, token_ids=token_ids)
            if position == len(DECODE_PIECES) - 1:
                message.finish_reason = gen.FINISH_REASON_STOP
                message.usage.CopyFrom(gen.Usage(prompt_tokens=5, completion_tokens=3, cached_prompt_tokens=999))
            yield message
            if self.behaviour.decode_drains_after_first:
                await self.set_serving(False)
                await context.abort(grpc.StatusCode.UNAVAILABLE, handed_back_message(request.request_id),
                                    trailing_metadata=handed_back_trailer(request.request_id))
            if self.behaviour.decode_blocks_after_first:
                await self._wait_for_cancel()

    async def Release(self, request, context):
        self.calls.append(("Release", request))
        return inst.ReleaseResponse(released=True)

    async def Renew(self, request, context):
        self.calls.append(("Renew", request))
        return inst.RenewResponse(renewed=True)

    async def Generate(self, request, context):
        self.calls.append(("Generate", request))
        for position, (text, token_ids) in enumerate(DECODE_PIECES):
            message = gen.GenerateResponse(request_id=request.request_id, text=text, token_ids=token_ids)
            if position == len(DECODE_PIECES) - 1:
                message.finish_reason = gen.FINISH_REASON_LENGTH
                message.usage.CopyFrom(gen.Usage(prompt_tokens=5, completion_tokens=3))
            yield message

    async def _wait_for(self, event: asyncio.Event) -> None:
        self.waiting.set()
        try:
            await event.wait()
        except asyncio.CancelledError:
            self.cancelled.set()
            raise

    async def _wait_for_cancel(self) -> None:
        self.waiting.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            self.cancelled.set()
            raise


class _HangableHealth(health.aio.HealthServicer):
    """The standard health service, except that a hung fake never answers."""

    def __init__(self, fake: FakeInstance):
        super().__init__()
        self.fake = fake

    async def Check(self, request, context):
        self.fake.num_health_checks += 1
        if self.fake.is_hung:
            await asyncio.sleep(60)  # until the prober's timeout cancels the call
        return await super().Check(request, context)


async def register(registry: InstanceRegistry, fake: FakeInstance, model: str,
                   load: InstanceLoad = InstanceLoad(0, 0, 50, 100)) -> None:
    info = InstanceInfo(fake.instance_id, fake.role, fake.address, f"ucx-{fake.instance_id}", model,
                        cache=fake_cache_settings(model, **fake.cache_changes), **fake.versions)
    await registry.register(info, load)


async def start_fakes(registry: InstanceRegistry, model: str, *fakes: FakeInstance) -> list[FakeInstance]:
    for fake in fakes:
        await fake.start()
        await register(registry, fake, model)
    return list(fakes)


async def hold_prefix(index: PrefixIndex, fake: FakeInstance, block_hashes: list[bytes]) -> None:
    await index.add(fake.instance_id, block_hashes)
