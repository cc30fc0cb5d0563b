"""Tensor and pipeline parallelism on a tiny random Llama: worker processes, same greedy output.

8 heads / 4 KV heads / 4 layers, so TP=2, PP=2 and TP=2 x PP=2 all split it. In fp32 every
layout must produce exactly the single-process greedy tokens (random weights with logits far
from ties); small prefill chunks put several requests and chunks in one step (so pipeline
micro-batches have something to split), and every block returns to the pool.
"""

import os
import shutil
import signal

import pytest
from transformers import LlamaConfig
from transformers import LlamaForCausalLM as HFLlamaForCausalLM

from shared.engine import LLM, SamplingParams
from shared.errors import ConfigurationError
from shared.executor import multiproc
from shared.executor.multiproc import WorkerFailedError
from tests.unit.conftest import TINY_LLAMA

import torch

PROMPTS = [[5, 9, 13, 2 + i, 40, 41, 42, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17][: 6 + 4 * i] for i in range(4)]
GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
ENGINE = dict(dtype="float32", num_blocks=64, max_num_batched_tokens=24)


@pytest.fixture(scope="module")
def parallel_llama_folder(tmp_path_factory):
    config = LlamaConfig(**{**TINY_LLAMA, "num_attention_heads": 8, "num_key_value_heads": 4,
                            "num_hidden_layers": 4}, tie_word_embeddings=True)
    torch.manual_seed(3)
    folder = tmp_path_factory.mktemp("parallel_llama")
    HFLlamaForCausalLM(config).eval().save_pretrained(folder)
    return str(folder)


@pytest.fixture(scope="module")
def reference(parallel_llama_folder):
    """(greedy tokens, the whole KV cache afterwards) of the single-process engine."""
    llm = LLM(model=parallel_llama_folder, **ENGINE)
    tokens = [output.token_ids for output in llm.generate(PROMPTS, GREEDY)]
    return tokens, llm.engine.core.executor.kv_cache.clone()


@pytest.mark.parametrize("tp,pp", [(2, 1), (1, 2), (2, 2)])
def test_parallel_greedy_output_and_kv_equal_single_process(parallel_llama_folder, reference, tp, pp):
    reference_tokens, reference_kv = reference
    with LLM(model=parallel_llama_folder, tensor_parallel_size=tp, pipeline_parallel_size=pp, **ENGINE) as llm:
        outputs = llm.generate(PROMPTS, GREEDY)
        assert [output.token_ids for output in outputs] == reference_tokens
        pool = llm.engine.core.block_pool
        assert pool.num_free_blocks == pool.num_blocks
        executor = llm.engine.core.executor
        assert executor.num_steps > 0
        # Every rank's KV shard, put back together, is the single-process cache (same block
        # tables); this is what a prefill instance sends.
        gathered, layout, _ = executor.blocks_for_send(list(range(pool.num_blocks)))
        assert layout.shape == reference_kv.shape
        torch.testing.assert_close(gathered, reference_kv, rtol=1e-5, atol=1e-5)
        # What a decode instance received reaches every rank's shard.
        executor.kv_cache[:, :, 5] = torch.randn(executor.kv_cache[:, :, 5].shape)
        executor.commit_received_blocks([5])
        assert torch.equal(executor.blocks_for_send([5])[0][:, :, 0], executor.kv_cache[:, :, 5])


def test_tensor_parallel_size_that_does_not_divide_the_heads_is_refused(parallel_llama_folder):
    with pytest.raises(ConfigurationError, match="tensor_parallel_size: 3 must divide"):
        LLM(model=parallel_llama_folder, tensor_parallel_size=3, **ENGINE)


def test_killed_worker_fails_the_step_cleanly(parallel_llama_folder):
    with LLM(model=parallel_llama_folder, tensor_parallel_size=2, **ENGINE) as llm:
        os.kill(llm.engine.core.executor.worker_pids[1], signal.SIGKILL)
        with pytest.raises(WorkerFailedError, match="rank 1 exited"):
            llm.generate(PROMPTS[:1], GREEDY)
        with pytest.raises(WorkerFailedError):
            llm.generate(PROMPTS[:1], GREEDY)
        assert not llm.engine.has_unfinished_requests()
        pool = llm.engine.core.block_pool
        assert pool.num_free_blocks == pool.num_blocks


def test_hung_worker_is_detected_by_the_step_timeout(parallel_llama_folder):
    with LLM(model=parallel_llama_folder, pipeline_parallel_size=2, worker_step_timeout_s=3.0, **ENGINE) as llm:
        os.kill(llm.engine.core.executor.worker_pids[0], signal.SIGSTOP)
        with pytest.raises(WorkerFailedError, match="hangs"):
            llm.generate(PROMPTS[:1], GREEDY)


def test_worker_failing_to_start_is_reported_and_leaves_nothing_behind(parallel_llama_folder, tmp_path, monkeypatch):
    broken = tmp_path / "broken"
    shutil.copytree(parallel_llama_folder, broken)
    (broken / "model.safetensors").write_bytes(b"not a checkpoint")
    made = []

    class RecordedShards(multiproc.SharedKVShards):
        def __init__(self, *args):
            super().__init__(*args)
            made.append(self.folder)
    create_ring = multiproc.ShmRing.create

    def recorded_ring(**kwargs):
        ring = create_ring(**kwargs)
        made.append(ring)
        return ring
    monkeypatch.setattr(multiproc, "SharedKVShards", RecordedShards)
    monkeypatch.setattr(multiproc.ShmRing, "create", recorded_ring)
    with pytest.raises(WorkerFailedError, match="exited with code 1 during start"):
        LLM(model=str(broken), tensor_parallel_size=2, **ENGINE)
    folder, steps, replies = made
    assert not os.path.exists(folder)
    for ring in (steps, replies):
        assert not os.path.exists(f"/dev/shm/{ring.memory.name.lstrip('/')}")
