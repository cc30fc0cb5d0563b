"""The engine's prefill/decode split through the KV connector interface, without services:
the in-memory connector carries the KV between engines of one process (one engine playing
both roles, or a producer and a consumer). The result must equal a plain local run, seeded
sampling included, and every block must come back."""

import pytest
import torch

from shared.engine import SamplingParams
from shared.engine.introspection import engine_info
from shared.engine_api.client import CacheSettings
from shared.engine_api.errors import CapacityError
from shared.errors import InvalidRequestError
from shared.kv_transfer.types import FinishedTransfers, KVConnectorRole, KVTransferConfig
from tests.unit.kv_split import connected_llm, first_token_params, kv_arrivals, run_prefill, run_split, send_params

UCX_CONNECTOR = "shared.kv_transfer.ucx.connector:UCXConnector"
PROMPT = list(range(30, 67))  # 37 tokens: 2 full blocks of 16 and a partial one


def make_llm(folder, **kwargs):
    return connected_llm(folder, **kwargs)


def assert_pool_is_whole(llm) -> None:
    pool = llm.engine.core.block_pool
    assert pool.num_free_blocks == pool.num_blocks


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=0, max_tokens=6, ignore_eos=True),
    SamplingParams(temperature=1.0, top_k=20, seed=99, max_tokens=6, ignore_eos=True),
])
def test_split_run_equals_local_run(tiny_llama_folder, params):
    local = make_llm(tiny_llama_folder).generate([PROMPT], params)[0].token_ids
    llm = make_llm(tiny_llama_folder, enable_prefix_caching=False)
    assert run_split(llm, PROMPT, params) == local
    assert_pool_is_whole(llm)


def test_the_same_blocks_arrive_from_a_producer_engine(tiny_llama_folder):
    producer = connected_llm(tiny_llama_folder, KVConnectorRole.PRODUCER, enable_prefix_caching=False)
    consumer = connected_llm(tiny_llama_folder, KVConnectorRole.CONSUMER, enable_prefix_caching=False)
    reservation = consumer.engine.reserve_request(PROMPT, SamplingParams(max_tokens=4), "r")
    sources = []
    real_request_finished = producer.engine.core.connector.request_finished

    def remember_blocks(request_id, block_ids, send):
        sources.extend(block_ids)
        return real_request_finished(request_id, block_ids, send)
    producer.engine.core.connector.request_finished = remember_blocks
    output = run_prefill(producer.engine, PROMPT, SamplingParams(temperature=0, max_tokens=1), "r",
                         send_params(consumer.engine, reservation, "r"))
    assert output.kv_transfer.num_bytes == 3 * producer.engine.core.executor.kv_cache_layout.bytes_per_block
    sent = producer.engine.core.executor.kv_cache[:, :, sources]
    assert torch.equal(consumer.engine.core.executor.kv_cache[:, :, reservation.block_ids], sent)
    assert_pool_is_whole(producer)  # freed once sent
    consumer.engine.step()
    assert kv_arrivals(consumer.engine) == [("r", None)]
    consumer.engine.abort_request("r")
    assert_pool_is_whole(consumer)


def test_a_failed_send_frees_the_blocks_and_the_consumer_waits_for_a_retry(tiny_llama_folder):
    llm = make_llm(tiny_llama_folder, enable_prefix_caching=False)
    engine, params = llm.engine, SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)
    reservation = engine.reserve_request(PROMPT, params, "d")
    engine.core.connector.fail_next_sends = 1
    failed = run_prefill(engine, PROMPT, first_token_params(params), "p1", send_params(engine, reservation, "d"))
    assert failed.kv_transfer is None and "injected" in failed.kv_transfer_error
    engine.step()
    assert [error is not None for _, error in kv_arrivals(engine)] == [True]
    with pytest.raises(InvalidRequestError, match="has not arrived"):
        engine.start_reserved("d", 1)
    retried = run_prefill(engine, PROMPT, first_token_params(params), "p2", send_params(engine, reservation, "d"))
    assert retried.kv_transfer is not None
    local = make_llm(tiny_llama_folder).generate([PROMPT], params)[0].token_ids
    from tests.unit.kv_split import decode_after
    assert decode_after(engine, "d", retried.outputs[0].token_ids[0]) == local
    assert_pool_is_whole(llm)


def test_a_wrong_token_writes_nothing(tiny_llama_folder):
    llm = make_llm(tiny_llama_folder, enable_prefix_caching=False)
    engine = llm.engine
    reservation = engine.reserve_request(PROMPT, SamplingParams(max_tokens=4), "d")
    before = engine.core.executor.kv_cache[:, :, reservation.block_ids].clone()
    send = send_params(engine, reservation, "d")
    forged = type(send)(send.remote_address, "d", send.remote_block_ids, 0, b"forged")
    output = run_prefill(engine, PROMPT, SamplingParams(temperature=0, max_tokens=1), "p", forged)
    assert output.kv_transfer_error.startswith("transfer_token")
    assert torch.equal(engine.core.executor.kv_cache[:, :, reservation.block_ids], before)
    assert kv_arrivals(engine) == []  # the consumer is not disturbed
    engine.abort_request("d")
    assert_pool_is_whole(llm)


def test_blocks_the_consumer_holds_are_not_sent(tiny_llama_folder):
    llm = make_llm(tiny_llama_folder)
    engine = llm.engine
    llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=1))
    reservation = engine.reserve_request(PROMPT, SamplingParams(max_tokens=4), "d")
    assert reservation.num_cached_tokens == 32 and reservation.num_skip_blocks == 2
    output = run_prefill(engine, PROMPT, SamplingParams(temperature=0, max_tokens=1), "p",
                         send_params(engine, reservation, "d"))
    assert output.kv_transfer.num_bytes == engine.core.executor.kv_cache_layout.bytes_per_block
    engine.abort_request("d")
    assert_pool_is_whole(llm)


def test_aborting_a_request_whose_kv_is_being_sent_frees_its_blocks_once_sent(tiny_llama_folder):
    llm = make_llm(tiny_llama_folder, enable_prefix_caching=False)
    engine = llm.engine
    reservation = engine.reserve_request(PROMPT, SamplingParams(max_tokens=4), "d")
    # The in-memory copy ends at once; its end is held back here, as a slow network send's is.
    real_get_finished, held = engine.core.connector.get_finished, []

    def get_finished_but_sends():
        finished = real_get_finished()
        held.extend(finished.sending)
        return FinishedTransfers((), finished.receiving)
    engine.core.connector.get_finished = get_finished_but_sends
    engine.add_request(PROMPT, SamplingParams(temperature=0, max_tokens=1), "p",
                       kv_send=send_params(engine, reservation, "d"))
    while "p" not in engine.core.scheduler.sending:
        assert not [o for o in engine.step() if o.request_id == "p" and o.finished]
    assert engine.abort_request("p") is None
    engine.step()
    assert "p" in engine.core.scheduler.sending  # its blocks are still being read
    engine.core.connector.get_finished = lambda: FinishedTransfers(tuple(held), real_get_finished().receiving)
    engine.step()  # the send ends
    engine.core.connector.get_finished = real_get_finished
    assert "p" not in engine.core.scheduler.sending and not engine.core.scheduler.requests.get("p")
    engine.abort_request("d")
    assert_pool_is_whole(llm)


def test_reserve_refuses_when_full_and_changes_nothing(tiny_llama_folder):
    llm = make_llm(tiny_llama_folder, num_blocks=4, enable_prefix_caching=False)
    llm.engine.reserve_request(PROMPT, SamplingParams(max_tokens=4), request_id="a")
    with pytest.raises(CapacityError):
        llm.engine.reserve_request(PROMPT, SamplingParams(max_tokens=4), request_id="b")
    assert not llm.engine.core.scheduler.requests.get("b")
    assert llm.engine.release_reserved("a") and not llm.engine.release_reserved("a")
    assert llm.engine.core.block_pool.num_free_blocks == 4


def test_starting_an_unknown_reservation_names_the_field(tiny_llama_folder):
    llm = make_llm(tiny_llama_folder)
    with pytest.raises(InvalidRequestError, match="request_id"):
        llm.engine.start_reserved("nope", 1)


def test_an_engine_without_a_consumer_connector_refuses_reservations(tiny_llama_folder):
    producer = connected_llm(tiny_llama_folder, KVConnectorRole.PRODUCER)
    with pytest.raises(InvalidRequestError, match="kv_transfer"):
        producer.engine.reserve_request(PROMPT, SamplingParams(max_tokens=4), "d")
    assert_pool_is_whole(producer)
    assert not producer.engine.has_unfinished_requests()


def test_a_connector_that_cannot_arm_the_receive_leaves_nothing_reserved(tiny_llama_folder):
    llm = make_llm(tiny_llama_folder)

    def cannot_arm(*args):
        raise RuntimeError("listener gone (injected)")
    llm.engine.core.connector.update_state_after_alloc = cannot_arm
    with pytest.raises(RuntimeError, match="injected"):
        llm.engine.reserve_request(PROMPT, SamplingParams(max_tokens=4), "d")
    assert_pool_is_whole(llm)
    assert not llm.engine.has_unfinished_requests() and not llm.engine.core.scheduler.requests


def test_cache_settings_say_what_a_peer_must_share(tiny_llama_folder):
    llm = make_llm(tiny_llama_folder, block_size=8, prefix_hash_algo="blake2b")
    assert engine_info(llm.engine.core).cache == CacheSettings(
        model_id=tiny_llama_folder.name, block_size=8, prefix_hash_algo="blake2b", dtype="float32",
        kv_layout="kv,layer,block,slot,kv_head,head_dim;layers=2;kv_heads=2;head_dim=16", tensor_parallel_size=1)


@pytest.mark.parametrize("connector", ["in_memory", "ucx"])
def test_the_step_that_prefills_a_prompt_returns_it_once_its_kv_is_sent(tiny_llama_folder, connector):
    # The prefill service answers the gateway on the final output: it must not wait for the
    # next step's compute. A send that ends within the connector's send wait (at once in
    # memory, a few ms over UCX; 30 s here so the test cannot race) goes out with the step
    # that started it, after the output carrying the first token.
    kwargs = {} if connector == "in_memory" else {"kv_transfer": KVTransferConfig(
        UCX_CONNECTOR, KVConnectorRole.BOTH, send_wait_s=30.0)}
    llm = connected_llm(tiny_llama_folder, enable_prefix_caching=False, **kwargs)
    try:
        engine = llm.engine
        params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
        reservation = engine.reserve_request(PROMPT, params, "d")
        engine.add_request(PROMPT, first_token_params(params), "p", kv_send=send_params(engine, reservation, "d"))
        first, final = [output for output in engine.step() if output.request_id == "p"]
        assert not first.finished and len(first.outputs[0].delta_token_ids) == 1
        assert final.finished and final.kv_transfer is not None, final.kv_transfer_error
        assert final.outputs[0].delta_token_ids == [] and final.token_ids == first.token_ids
        engine.step()
        assert kv_arrivals(engine) == [("d", None)]
        engine.abort_request("d")
        assert_pool_is_whole(llm)
    finally:
        llm.engine.shutdown()


def test_a_prefill_hands_out_its_first_token_before_its_kv_send_ends(tiny_llama_folder):
    # The first token (with its logprobs and the prompt logprobs) leaves the engine in the step
    # that sampled it, unfinished; the finish waits for the send, whose end is held back here
    # as a slow network's would be, and then says what moved.
    llm = make_llm(tiny_llama_folder, enable_prefix_caching=False)
    engine = llm.engine
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True, logprobs=2, prompt_logprobs=1)
    reservation = engine.reserve_request(PROMPT, params, "d")
    real_get_finished, held = engine.core.connector.get_finished, []

    def get_finished_but_sends():
        finished = real_get_finished()
        held.extend(finished.sending)
        return FinishedTransfers((), finished.receiving)
    engine.core.connector.get_finished = get_finished_but_sends
    engine.add_request(PROMPT, first_token_params(params), "p", kv_send=send_params(engine, reservation, "d"))
    outputs = []
    while not outputs:
        outputs = [o for o in engine.step() if o.request_id == "p"]
    [first] = outputs
    assert not first.finished and "p" in engine.core.scheduler.sending
    assert len(first.token_ids) == 1 and len(first.outputs[0].logprobs) == 1
    assert len(first.prompt_logprobs) == len(PROMPT) - 1
    assert not [o for o in engine.step() if o.request_id == "p"]  # the send has not ended
    engine.core.connector.get_finished = lambda: FinishedTransfers(tuple(held), real_get_finished().receiving)
    [final] = [o for o in engine.step() if o.request_id == "p"]
    engine.core.connector.get_finished = real_get_finished
    assert final.finished and final.outputs[0].finish_reason == "length" and final.kv_transfer is not None
    assert final.outputs[0].delta_token_ids == [] and final.token_ids == first.token_ids
    from tests.unit.kv_split import decode_after
    local = make_llm(tiny_llama_folder).generate([PROMPT], params)[0].token_ids
    assert decode_after(engine, "d", first.token_ids[0]) == local
    assert_pool_is_whole(llm)


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=0, max_tokens=6, ignore_eos=True),
    SamplingParams(temperature=1.0, top_k=20, seed=99, max_tokens=6, ignore_eos=True),
])
def test_a_reservation_prefilled_here_equals_a_local_run(tiny_llama_folder, params):
    # Conditional disaggregation: the decode engine computes the reserved prompt itself.
    local = make_llm(tiny_llama_folder).generate([PROMPT], params)[0].token_ids
    llm = make_llm(tiny_llama_folder, enable_prefix_caching=False)
    engine = llm.engine
    engine.reserve_request(PROMPT, params, "d")
    assert engine.prefill_reserved("d") == []
    assert "d" not in engine.core.scheduler.waiting_for_remote_kv
    output = None
    while output is None or not output.finished:
        output = next((o for o in engine.step() if o.request_id == "d"), output)
    assert output.token_ids == local
    with pytest.raises(InvalidRequestError, match="request_id"):
        engine.prefill_reserved("d")  # no reservation any more
    assert_pool_is_whole(llm)


def test_a_reservation_prefilled_here_computes_only_what_the_prefix_cache_lacks(tiny_llama_folder):
    llm = make_llm(tiny_llama_folder)
    engine, params = llm.engine, SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
    expected = llm.generate([PROMPT], params)[0].token_ids  # leaves the prompt's 2 full blocks cached
    computed = engine.core.stats.num_prompt_tokens_computed
    assert engine.reserve_request(PROMPT, params, "d").num_cached_tokens == 32
    engine.prefill_reserved("d")
    output = None
    while output is None or not output.finished:
        output = next((o for o in engine.step() if o.request_id == "d"), output)
    assert output.token_ids == expected and output.num_cached_tokens == 32
    assert engine.core.stats.num_prompt_tokens_computed - computed == len(PROMPT) - 32
    assert_pool_is_whole(llm)


def test_a_local_prefill_runs_in_chunks_after_the_running_decodes(tiny_llama_folder):
    # The decode instance's protection: every step still gives the running decode its token,
    # and the reserved prompt only gets a chunk of at most long_prefill_token_threshold.
    llm = make_llm(tiny_llama_folder, enable_prefix_caching=False, long_prefill_token_threshold=8)
    engine = llm.engine
    running = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    engine.add_request(list(range(5, 9)), running, "a")
    engine.step()  # "a"'s prompt
    engine.reserve_request(PROMPT, SamplingParams(temperature=0, max_tokens=2, ignore_eos=True), "d")
    engine.prefill_reserved("d")
    [local] = engine.requests_of("d")
    num_steps = 0
    while local.num_output_tokens == 0:
        before = (engine.requests_of("a")[0].num_output_tokens, local.num_computed_tokens)
        engine.step()
        num_steps += 1
        assert engine.requests_of("a")[0].num_output_tokens == before[0] + 1
        assert 0 < local.num_computed_tokens - before[1] <= 8
    assert num_steps == -(-len(PROMPT) // 8)
    engine.abort_request("a")
    engine.abort_request("d")
    assert_pool_is_whole(llm)
