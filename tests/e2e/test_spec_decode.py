"""Speculative decoding on the real SmolLM2 (bfloat16): greedy output equals non-speculative
output token for token, offline with either proposer and through the disaggregated stack
with the decode instance speculating (its draft computes the prompt's draft KV itself)."""

import pytest

from shared.engine import LLM, SamplingParams
from tests.helpers.gateway_client import generate, generate_request
from tests.helpers.greedy_compare import assert_greedy_agrees
from tests.helpers.stack import running_stack

DTYPE = "bfloat16"
CHATS = [
    [{"role": "user", "content": "Name two planets of the solar system."}],
    [{"role": "user", "content": "Repeat exactly: the quick brown fox jumps over the lazy dog."}],
    [{"role": "user", "content": "Write a haiku about the sea."}],
]
GREEDY = SamplingParams(temperature=0, max_tokens=32)
DRAFT_ARGS = ["--speculative-method", "draft", "--draft-num-layers", "4", "--num-speculative-tokens", "3"]


@pytest.fixture(scope="module")
def reference(smollm2_folder) -> LLM:
    return LLM(model=str(smollm2_folder), dtype=DTYPE, num_threads=1)


@pytest.fixture(scope="module")
def reference_tokens(reference) -> list[list[int]]:
    return [output.outputs[0].token_ids for output in reference.chat(CHATS, GREEDY)]


@pytest.mark.parametrize("spec", [
    dict(speculative_method="ngram", num_speculative_tokens=4),
    dict(speculative_method="draft", draft_num_layers=6, num_speculative_tokens=3),
], ids=["ngram", "draft"])
def test_greedy_chat_with_speculation_equals_without(smollm2_folder, reference_tokens, spec):
    llm = LLM(model=str(smollm2_folder), dtype=DTYPE, num_threads=1, **spec)
    assert [output.outputs[0].token_ids for output in llm.chat(CHATS, GREEDY)] == reference_tokens
    assert llm.engine.core.spec_stats.num_draft_tokens > 0
    pool = llm.engine.core.block_pool
    assert pool.num_free_blocks == pool.num_blocks


def test_disaggregated_decode_instance_speculates(smollm2_folder, reference, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("spec_stack")
    stack_runner = running_stack(smollm2_folder, DTYPE, num_prefill=1, num_decode=1, run_dir=run_dir,
                                 extra_args={"instance": ["--num-blocks", "256"], "decode": DRAFT_ARGS})
    stack = next(stack_runner)
    try:
        for chat in CHATS[:2]:
            [expected_output] = reference.chat([chat], GREEDY)
            expected = expected_output.outputs[0]
            got = generate(stack.gateway, generate_request(chat=chat, max_tokens=GREEDY.max_tokens))
            # Up to a bf16 near-tie: the stack batches and caches differently from the reference.
            assert_greedy_agrees(reference, expected_output.prompt_token_ids, list(got.token_ids), expected.token_ids)
        stack.wait_all_blocks_free()
        stack.check_children_alive()
    finally:
        stack_runner.close()
    # Only the decode instance loaded a draft: prefill instances ignore speculation.
    assert "draft model: 4 layers" in (run_dir / "logs" / "decode-0.log").read_text()
    assert "draft model" not in (run_dir / "logs" / "prefill-0.log").read_text()
