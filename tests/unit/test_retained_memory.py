"""No request leaves Python memory behind: hundreds of requests of every kind through a prefill
engine and a decode engine (in process, KV carried by the in-memory KV connector), then tracemalloc's
retained bytes and blocks per request must be near zero and every KV block back in its pool.

Kinds: plain, long prompts, n=2 with logprobs=5 (two decode requests, as the gateway fans out),
cancelled mid-stream, and guided JSON with a schema no earlier request used. A warm-up round
first fills what is bounded on purpose (the grammar cache), so that what remains is what would
grow without bound. The prefix cache is off: its hashes live in the pool's blocks and are
bounded by the pool's size, but a partly filled pool keeps growing them for a while.
"""

import gc
import json
import random
import tracemalloc

from shared.engine import LLM, SamplingParams
from shared.guided import GuidedDecodingParams as Guided
from shared.kv_transfer.types import KVConnectorRole, KVTransferConfig
from tests.unit.guided_vocab import tiny_grammar_cache
from tests.unit.kv_split import IN_MEMORY, kv_arrivals, send_params

KINDS = ("plain", "long", "n2_logprobs", "cancelled", "guided")
BATCH = 20
NUM_WARMUP_BATCHES = 2
NUM_BATCHES = 5  # 100 requests of each kind (200 for n=2)
MAX_RETAINED_BYTES_PER_REQUEST = 256
# torch keeps a few small per-shape objects (~0.5 a request here, saturating); a leaked object
# graph (a request, its token list) is several blocks a request.
MAX_RETAINED_BLOCKS_PER_REQUEST = 1.0


def make_llm(folder, role: KVConnectorRole) -> LLM:
    llm = LLM(model=str(folder), dtype="float32", num_blocks=256, block_size=16,
              enable_prefix_caching=False, kv_transfer=KVTransferConfig(IN_MEMORY, role))
    llm.engine.core.guided.use_grammar_cache(tiny_grammar_cache(max_entries=8))
    return llm


def request_params(kind: str, index: int) -> SamplingParams:
    if kind == "n2_logprobs":
        return SamplingParams(temperature=1.0, seed=index, max_tokens=4, logprobs=5, ignore_eos=True)
    if kind == "guided":
        schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": index}},
                  "required": ["n"]}
        return SamplingParams(temperature=1.0, seed=index, max_tokens=12, guided=Guided(json_schema=json.dumps(schema)))
    return SamplingParams(temperature=1.0, seed=index, max_tokens=6, ignore_eos=True)


def batch_requests(kind: str, first_index: int, rng: random.Random) -> list[tuple[str, list[int], SamplingParams]]:
    low, high = (60, 100) if kind == "long" else (3, 24)
    copies = 2 if kind == "n2_logprobs" else 1
    requests = []
    for index in range(first_index, first_index + BATCH):
        prompt = [rng.randrange(3, 256) for _ in range(rng.randint(low, high))]
        requests += [(f"{kind}-{index}-{copy}", prompt, request_params(kind, index)) for copy in range(copies)]
    return requests


def prefill_all(prefill: LLM, decode: LLM, requests) -> dict[str, int]:
    """Reserve each request on the decode engine, prefill it with its KV sent there through the
    in-memory connector; the first tokens."""
    for request_id, prompt, params in requests:
        reservation = decode.engine.reserve_request(prompt, params, request_id=request_id)
        first_params = SamplingParams(**{**params.__dict__, "max_tokens": 1, "min_tokens": 0})
        prefill.engine.add_request(prompt, first_params, request_id=request_id,
                                   kv_send=send_params(decode.engine, reservation, request_id))
    first_tokens = {}
    while prefill.engine.has_unfinished_requests():
        first_tokens.update({o.request_id: o.outputs[0].token_ids[0] for o in prefill.engine.step() if o.finished})
    return first_tokens


def decode_all(decode: LLM, requests, first_tokens: dict[str, int], is_cancelled: bool) -> None:
    decode.engine.step()  # applies the arrivals
    assert len(kv_arrivals(decode.engine)) == len(requests)
    for request_id, _, _ in requests:
        decode.engine.start_reserved(request_id, first_tokens[request_id])
    decode.engine.step()
    if is_cancelled:
        for request_id, _, _ in requests:
            decode.engine.abort_request(request_id)
    while decode.engine.has_unfinished_requests():
        decode.engine.step()


def run_round(prefill: LLM, decode: LLM, first_index: int, rng: random.Random) -> int:
    num_requests = 0
    for kind in KINDS:
        requests = batch_requests(kind, first_index, rng)
        decode_all(decode, requests, prefill_all(prefill, decode, requests), kind == "cancelled")
        num_requests += len(requests)
    return num_requests


def traced_now() -> tracemalloc.Snapshot:
    gc.collect()
    return tracemalloc.take_snapshot()


def retained(start: tracemalloc.Snapshot, end: tracemalloc.Snapshot) -> tuple[int, int, str]:
    """(bytes, blocks) allocated since `start` and still live, and where the most were made."""
    diffs = end.compare_to(start, "lineno")
    top = "\n".join(str(diff) for diff in diffs[:3])
    return sum(d.size_diff for d in diffs), sum(d.count_diff for d in diffs), top


def assert_pools_whole(*llms: LLM) -> None:
    for llm in llms:
        pool = llm.engine.core.block_pool
        assert pool.num_free_blocks == pool.num_blocks


def test_requests_of_every_kind_leave_no_python_memory_behind(tiny_llama_folder):
    tracemalloc.start()  # before the engines exist, so that what they allocate at start is traced too
    try:
        prefill = make_llm(tiny_llama_folder, KVConnectorRole.PRODUCER)
        decode = make_llm(tiny_llama_folder, KVConnectorRole.CONSUMER)
        rng = random.Random(0)
        for batch in range(NUM_WARMUP_BATCHES):  # fills the grammar cache
            run_round(prefill, decode, BATCH * batch, rng)
        start = traced_now()
        num_requests = sum(run_round(prefill, decode, BATCH * (NUM_WARMUP_BATCHES + batch), rng)
                           for batch in range(NUM_BATCHES))
        num_bytes, num_blocks, top = retained(start, traced_now())
    finally:
        tracemalloc.stop()
    assert num_requests >= len(KINDS) * BATCH * NUM_BATCHES
    assert num_bytes / num_requests < MAX_RETAINED_BYTES_PER_REQUEST, top
    assert num_blocks / num_requests < MAX_RETAINED_BLOCKS_PER_REQUEST, top
    assert_pools_whole(prefill, decode)
    assert len(prefill.engine.core.scheduler.requests) == len(decode.engine.core.scheduler.requests) == 0
    assert not prefill.engine.core.scheduler.sending
