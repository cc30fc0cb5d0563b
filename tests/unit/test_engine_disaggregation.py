"""The engine's prefill/decode split without services: hold, reserve, copy KV, activate.

One engine plays both roles; the KV is copied block by block as the UCX transfer would.
The result must equal a plain local run, seeded sampling included.
"""

import pytest

from shared.engine import LLM, SamplingParams
from shared.engine.client import CacheSettings
from shared.engine.llm_engine import CapacityError
from shared.errors import InvalidRequestError

PROMPT = list(range(30, 67))  # 37 tokens: 2 full blocks of 16 and a partial one


def make_llm(folder, **kwargs) -> LLM:
    return LLM(model=str(folder), dtype="float32", num_blocks=kwargs.pop("num_blocks", 32), **kwargs)


def run_split(llm: LLM, params: SamplingParams) -> list[int]:
    engine = llm.engine
    prefill_params = SamplingParams(**{**params.__dict__, "max_tokens": 1, "min_tokens": min(params.min_tokens, 1)})
    engine.add_request(PROMPT, prefill_params, request_id="p", hold_blocks_on_finish=True)
    first = None
    while first is None:
        for output in engine.step():
            if output.finished:
                first = output.token_ids[0]
    src_blocks = engine.held_block_ids("p")
    reservation = engine.reserve_request(PROMPT, params, request_id="d")
    kv_cache = engine.executor.kv_cache
    kv_cache[:, :, reservation.block_ids] = kv_cache[:, :, src_blocks]
    engine.release_request("p")
    tokens = list(engine.activate_request("d", first)[0].token_ids)
    while engine.has_unfinished_requests():
        for output in engine.step():
            tokens = output.token_ids
    return tokens


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=0, max_tokens=6, ignore_eos=True),
    SamplingParams(temperature=1.0, top_k=20, seed=99, max_tokens=6, ignore_eos=True),
])
def test_split_run_equals_local_run(tiny_llama_folder, params):
    local = make_llm(tiny_llama_folder).generate([PROMPT], params)[0].token_ids
    llm = make_llm(tiny_llama_folder, enable_prefix_caching=False)
    assert run_split(llm, params) == local
    pool = llm.engine.block_pool
    assert pool.num_free_blocks == pool.num_blocks


def test_reservation_reuses_the_decode_sides_prefix_cache(tiny_llama_folder):
    llm = make_llm(tiny_llama_folder)
    llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=1))
    reservation = llm.engine.reserve_request(PROMPT, SamplingParams(max_tokens=4), request_id="d")
    assert reservation.num_cached_tokens == 32 and len(reservation.block_ids) == 3
    assert reservation.num_skip_blocks == 2  # counted once, here: the gateway passes it on
    llm.engine.abort_request("d")
    assert llm.engine.block_pool.num_free_blocks == llm.engine.block_pool.num_blocks


def test_reserve_refuses_when_full_and_changes_nothing(tiny_llama_folder):
    llm = make_llm(tiny_llama_folder, num_blocks=4, enable_prefix_caching=False)
    llm.engine.reserve_request(PROMPT, SamplingParams(max_tokens=4), request_id="a")
    with pytest.raises(CapacityError):
        llm.engine.reserve_request(PROMPT, SamplingParams(max_tokens=4), request_id="b")
    assert not llm.engine.scheduler.requests.get("b")
    llm.engine.abort_request("a")
    assert llm.engine.block_pool.num_free_blocks == 4


def test_activating_an_unknown_request_names_the_field(tiny_llama_folder):
    llm = make_llm(tiny_llama_folder)
    with pytest.raises(InvalidRequestError, match="request_id"):
        llm.engine.activate_request("nope", 1)


def test_cache_settings_say_what_a_peer_must_share(tiny_llama_folder):
    llm = make_llm(tiny_llama_folder, block_size=8, prefix_hash_algo="blake2b")
    assert llm.engine.cache_settings() == CacheSettings(
        model_id=tiny_llama_folder.name, block_size=8, prefix_hash_algo="blake2b", dtype="float32",
        kv_layout="kv,layer,block,slot,kv_head,head_dim;layers=2;kv_heads=2;head_dim=16", tensor_parallel_size=1)
