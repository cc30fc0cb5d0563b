"""The KV handoff names the LoRA adapter the KV was computed with, and the decode side checks it.

A reservation records its request's adapter key; the prefill side's send carries its own
request's key (the KV header's `adapter_key` over UCX, KVSendParams in memory). KV computed
with another adapter, or with the base model for an adapter's reservation, is refused naming
`adapter_key` and writes nothing (the reservation keeps waiting for the right sender, as after
any failed transfer); matching KV decodes to the adapter's own output. One engine
plays both roles, through the in-memory connector and through UCX over loopback.
"""

import pytest
import torch

from shared.engine import LoRARequest, SamplingParams
from shared.kv_transfer.types import KVConnectorRole, KVTransferConfig
from tests.helpers.lora_adapters import AdapterSpec, save_peft_adapter
from tests.unit.kv_split import connected_llm, decode_after, first_token_params, kv_arrivals, send_params

UCX_CONNECTOR = "shared.kv_transfer.ucx.connector:UCXConnector"
PROMPT = [5, 17, 92, 3, 44, 101, 7, 8, 9, 200, 31]
PARAMS = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)


@pytest.fixture(scope="module")
def two_adapters(tiny_llama_folder, tmp_path_factory) -> tuple[LoRARequest, LoRARequest]:
    root = tmp_path_factory.mktemp("handoff_adapters")
    specs = [AdapterSpec(rank=4, alpha=8, target_modules=("q_proj", "v_proj"), seed=31 + i, std=0.3) for i in range(2)]
    return tuple(LoRARequest(f"a{i}", i + 1, str(save_peft_adapter(tiny_llama_folder, root / f"a{i}", spec)))
                 for i, spec in enumerate(specs))


def make_llm(folder, connector: str):
    kwargs = {} if connector == "in_memory" else {"kv_transfer": KVTransferConfig(
        UCX_CONNECTOR, KVConnectorRole.BOTH, send_wait_s=30.0)}
    return connected_llm(folder, enable_prefix_caching=False, enable_lora=True, max_lora_rank=4, **kwargs)


def prefill_into(engine, reservation, request_id: str, lora: LoRARequest | None):
    engine.add_request(PROMPT, first_token_params(PARAMS), request_id, lora_request=lora,
                       kv_send=send_params(engine, reservation, "d"))
    while True:
        for output in engine.step():
            if output.request_id == request_id and output.finished:
                return output


@pytest.mark.parametrize("connector", ["in_memory", "ucx"])
def test_kv_of_another_adapter_is_refused_and_matching_kv_decodes(tiny_llama_folder, two_adapters, connector):
    wanted, other = two_adapters
    llm = make_llm(tiny_llama_folder, connector)
    try:
        engine = llm.engine
        reservation = engine.reserve_request(PROMPT, PARAMS, "d", lora_request=wanted)
        kv_cache = engine.core.executor.kv_cache
        kv_cache[:, :, list(reservation.block_ids)] = 7.0  # a canary: any write shows
        for index, (lora, sender_says) in enumerate([(other, "lora:a1:"), (None, "the base model")]):
            refused = prefill_into(engine, reservation, f"p{index}", lora)
            assert refused.kv_transfer is None and "adapter_key" in refused.kv_transfer_error
            assert sender_says in refused.kv_transfer_error and "lora:a0:" in refused.kv_transfer_error
            engine.step()
            [(request_id, error)] = kv_arrivals(engine)
            assert request_id == "d" and "adapter_key" in error
            assert bool((kv_cache[:, :, list(reservation.block_ids)] == 7.0).all())
        accepted = prefill_into(engine, reservation, "p-right", wanted)
        assert accepted.kv_transfer is not None, accepted.kv_transfer_error
        tokens = decode_after(engine, "d", accepted.outputs[0].token_ids[-1])
        [alone] = llm.generate([PROMPT], PARAMS, lora_request=wanted)
        assert tokens == alone.outputs[0].token_ids
        pool = engine.core.block_pool
        assert pool.num_free_blocks == pool.num_blocks
    finally:
        llm.engine.shutdown()


def test_the_kv_header_carries_the_adapter_key():
    from shared.kv_cache.layout import KVCacheLayout
    from shared.kv_transfer.ucx.header import adapter_mismatch, build_header
    from shared.pb.pdserve.v1 import kv_transfer_pb2 as pb
    layout = KVCacheLayout(2, 8, 4, 2, 8, torch.float32)
    header = build_header("r", layout, [1], 4, True, b"t" * 16, "lora:sql:0123456789abcdef")
    assert pb.KVTransferHeader.FromString(header.SerializeToString()).adapter_key == "lora:sql:0123456789abcdef"
    assert not build_header("r", layout, [1], 4, True).HasField("adapter_key")
    assert adapter_mismatch("lora:a:1", "lora:a:1") is None and adapter_mismatch("", "") is None
    assert adapter_mismatch("", "lora:a:1") == "sender computed with the base model, the reservation is for lora:a:1"
