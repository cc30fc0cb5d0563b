"""`make bench-faults`, holder killed mid-pull: a KV holder is SIGKILLed while a prefill instance
is pulling a prefix's blocks from it, under the two-turn chat load (benchmarks.fault_chat_load).

The stack runs with the host tier off (as instances on different hosts: the peers are then the
only source of a prefix an instance lacks), so each chat's second turn pulls the first turn's
blocks from the decode instance that generated them. Once such pulls have happened, the holder
that served most of them is the victim, and the kill is made to land mid-pull:

    1. pick a conversation of which the victim holds the most blocks beyond what a prefill
       instance holds (per the prefix index): that instance will pull them;
    2. SIGSTOP the victim, so that a pull from it cannot finish;
    3. send that conversation's next turn to that prefill instance naming the victim as its
       peer source (as the gateway does), the KV going to the other decode instance;
    4. once that prefill instance's `pdserve:kv_peer_pulls_in_flight` shows the pull, SIGKILL
       the victim. If no pull shows within a bound the victim is killed anyway and the row
       says that no pull was in flight.

The pulled turn must then be computed by its prefill instance instead (no peer tokens) with
the same greedy tokens as the same prompt computed cold through the gateway (exact in fp32;
bf16 may differ by batching), the load's streams on the victim migrate, and every live
instance's blocks return to free.
"""

import asyncio
import os
import re
import signal
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import grpc
import redis.asyncio

from benchmarks.fault_load import greedy_request, random_prompt
from benchmarks.harness.fault_checks import ProcessIdentity
from shared.cluster.keys import ClusterNamespace
from shared.cluster.prefix_index import PrefixIndex
from shared.kv_cache.block_hash import hash_full_blocks
from shared.pb.pdserve.v1 import generation_pb2, instance_pb2, instance_pb2_grpc

BLOCK_SIZE = 16  # the instances' default --block-size
# Longer than any kill takes to land: only the holder's death ends the probe's pull.
PEER_TIMEOUT_S = 120.0
PROBE_MAX_TOKENS = 16
STACK_INSTANCE_ARGS = ["--kv-host-tier-gb", "0", "--kv-peer-timeout-s", str(PEER_TIMEOUT_S)]
# Every prompt prefilled on the prefill pool (none on a decode instance), so turns pull.
STACK_GATEWAY_ARGS = ["--local-prefill-max-tokens", "0", "--local-prefill-busy-max-tokens", "0"]


@dataclass
class PullKill:
    """What happened around the kill (the scenario's row adds the load's figures)."""

    victim: str
    pull_in_flight_at_kill: bool
    probe_ok: bool
    probe_correct: bool
    probe_peer_tokens: int
    note: str = ""
    killed: ProcessIdentity | None = None  # the victim's process as it was before the kill


# ---- metrics ---------------------------------------------------------------------------------


def metric_sum(text: str, name: str, **labels) -> float:
    """Sum of a Prometheus metric's samples in exposition `text` whose labels include `labels`."""
    total = 0.0
    for label_text, value in re.findall(rf"^{re.escape(name)}(?:_total)?(?:\{{([^}}]*)\}})? (\S+)$", text, re.M):
        found = dict(re.findall(r'(\w+)="([^"]*)"', label_text or ""))
        if all(found.get(key) == wanted for key, wanted in labels.items()):
            total += float(value)
    return total


def scrape(stack, name: str) -> str:
    address = stack.ready_info[name]["metrics_address"]
    return urllib.request.urlopen(f"http://{address}/metrics", timeout=10).read().decode()


def peer_sends(stack) -> dict[str, int]:
    """Prefixes each live instance has sent to pulling peers (its `pdserve:kv_peer_sends`)."""
    sends = {}
    for child in stack.instances:
        try:
            sends[child.name] = int(metric_sum(scrape(stack, child.name), "pdserve:kv_peer_sends"))
        except OSError:
            sends[child.name] = 0
    return sends


def pulled_blocks(stack) -> int:
    """Blocks the live prefill instances loaded from peers."""
    total = 0
    for child in stack.instances:
        if child.role == "prefill":
            try:
                total += int(metric_sum(scrape(stack, child.name), "pdserve:kv_tier_loads", tier="peer"))
            except OSError:
                pass
    return total


def pulls_in_flight(stack, name: str) -> int:
    return int(metric_sum(scrape(stack, name), "pdserve:kv_peer_pulls_in_flight"))


def wait_until(predicate, timeout_s: float, interval_s: float = 0.02) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval_s)
    return False


# ---- blocks ----------------------------------------------------------------------------------


def stranded_blocks(stack, timeout_s: float = 30.0) -> int:
    """Blocks still held on live instances once the load is over (releases are asynchronous:
    waits up to `timeout_s` for every free-block count to return to its total); -1 when an
    instance could not be asked until then."""
    def held() -> int | None:
        total = 0
        for child in stack.instances:
            if child.exit_code() is not None or child.name not in stack.addresses:
                continue
            try:
                with grpc.insecure_channel(stack.addresses[child.name]) as channel:
                    status = instance_pb2_grpc.InstanceStub(channel).GetStatus(instance_pb2.StatusRequest(),
                                                                               timeout=10)
            except grpc.RpcError:
                return None
            total += status.num_total_blocks - status.num_free_blocks
        return total
    deadline = time.monotonic() + timeout_s
    while (count := held()) != 0 and time.monotonic() < deadline:
        time.sleep(0.2)
    return -1 if count is None else count


# ---- the kill --------------------------------------------------------------------------------


def holdings(stack, conversations: list[list[int]], instance_ids: set[str]) -> list[dict[str, int]]:
    """Per conversation: the leading blocks each instance holds, per the prefix index."""
    namespace = ClusterNamespace(stack.config.deployment, Path(stack.config.model).name)
    model_key = (Path(stack.config.model).name,)

    async def read() -> list[dict[str, int]]:
        async with redis.asyncio.Redis.from_url(stack.redis_url, socket_timeout=5) as client:
            index = PrefixIndex(client, namespace)
            return [await index.longest_prefix(hash_full_blocks(c, BLOCK_SIZE, model_key), instance_ids)
                    for c in conversations]
    return asyncio.run(read())


def pick_pull(held: list[dict[str, int]], victim: str, pullers: list[str]) -> tuple[int, str, int] | None:
    """(conversation's number, puller, blocks it holds) where the victim holds the most blocks beyond
    what a puller holds (that puller then has most to pull); None when no puller lacks any."""
    best, best_gap = None, 0
    for number, counts in enumerate(held):
        for puller in pullers:
            gap = counts.get(victim, 0) - counts.get(puller, 0)
            if gap > best_gap:
                best, best_gap = (number, puller, counts.get(puller, 0)), gap
    return best


def kill_holder_mid_pull(stack, gateway_stub, load, seed: int, timeout_s: float = 60.0,
                         aim_pid: int | None = None) -> PullKill:
    """Steps 1-4 of the module's docstring, then the probe's outcome. `aim_pid`: the control
    run's decoy, stopped and killed instead of the holder."""
    sends = peer_sends(stack)
    victim = max((child.name for child in stack.instances if child.role == "decode"), key=sends.__getitem__)
    victim_child = next(child for child in stack.instances if child.name == victim)
    killed, aim = ProcessIdentity.of(victim_child.pid), aim_pid or victim_child.pid
    pullers = [child.name for child in stack.instances if child.role == "prefill"]
    other_decode = next(child for child in stack.instances if child.role == "decode" and child.name != victim)
    conversations = [prompt + result.token_ids for prompt, result in load.first_turns() if result.is_ok]
    held = holdings(stack, conversations, {victim, *pullers})
    pick = pick_pull(held, victim, pullers)
    if pick is None:
        os.kill(aim, signal.SIGKILL)
        return PullKill(victim, False, False, False, 0, note="the victim held nothing a prefill lacked: no probe",
                        killed=killed)
    number, puller, num_local_blocks = pick
    prompt = conversations[number] + random_prompt(24, seed)
    source = (victim, held[number][victim], num_local_blocks)
    os.kill(aim, signal.SIGSTOP)
    probe: dict = {}
    thread = threading.Thread(target=_probe, args=(stack, puller, other_decode.name, source, prompt, probe),
                              daemon=True)
    in_flight = False
    try:
        thread.start()
        in_flight = wait_until(lambda: pulls_in_flight(stack, puller) >= 1, timeout_s)
    finally:
        os.kill(aim, signal.SIGKILL)
    thread.join(PEER_TIMEOUT_S + 120)
    expected = _cold_tokens(gateway_stub, prompt)
    tokens = probe.get("tokens")
    note = (f"{puller} pulling {held[number][victim] - num_local_blocks} blocks of a "
            f"{len(prompt)}-token prompt from {victim}")
    if not in_flight:
        note += f"; no pull was in flight within {timeout_s:.0f} s: killed anyway"
    return PullKill(victim, in_flight, "error" not in probe and tokens is not None, tokens == expected,
                    probe.get("peer_tokens", -1), note=note + (f"; probe error {probe['error']}"
                                                             if "error" in probe else ""), killed=killed)


def _probe(stack, puller: str, decode: str, source: tuple[str, int, int], prompt: list[int], out: dict) -> None:
    """Reserve on `decode`, Prefill on `puller` naming `holder` as the peer source, Decode."""
    request_id = f"bench-pull-probe-{time.monotonic_ns()}"
    sampling = generation_pb2.SamplingParams(temperature=0.0, max_tokens=PROBE_MAX_TOKENS, ignore_eos=True)
    try:
        with grpc.insecure_channel(stack.addresses[decode]) as decode_channel, \
                grpc.insecure_channel(stack.addresses[puller]) as prefill_channel:
            decode_stub = instance_pb2_grpc.InstanceStub(decode_channel)
            reserved = decode_stub.Reserve(instance_pb2.ReserveRequest(
                request_id=request_id, prompt_token_ids=prompt, sampling=sampling, lease_ms=300_000), timeout=60)
            holder, num_blocks, num_local_blocks = source
            peer_source = instance_pb2.PeerSource(instance_id=holder, grpc_address=stack.addresses[holder],
                                                  num_blocks=num_blocks, num_local_blocks=num_local_blocks)
            prefilled = instance_pb2_grpc.InstanceStub(prefill_channel).Prefill(instance_pb2.PrefillRequest(
                request_id=request_id, prompt_token_ids=prompt, sampling=sampling,
                decode_ucx_address=reserved.ucx_address, dst_block_ids=reserved.block_ids,
                num_skip_blocks=reserved.num_skip_blocks, transfer_token=reserved.transfer_token,
                peer_source=peer_source), timeout=PEER_TIMEOUT_S + 60)
            out["peer_tokens"] = prefilled.num_peer_prompt_tokens
            out["tokens"] = [token for message in decode_stub.Decode(
                instance_pb2.DecodeRequest(request_id=request_id, first_token_id=prefilled.first_token_id),
                timeout=120) for token in message.token_ids]
    except grpc.RpcError as error:
        out["error"] = f"{error.code().name}: {error.details()}"


def _cold_tokens(gateway_stub, prompt: list[int]) -> list[int]:
    """The prompt computed from scratch through the gateway (a fresh cache salt: no reuse)."""
    request = greedy_request(prompt, PROBE_MAX_TOKENS)
    request.cache_salt = f"cold-{time.monotonic_ns()}"
    tokens = []
    for message in gateway_stub.Generate(request, timeout=300):
        tokens.extend(message.token_ids)
    return tokens
