"""Abort storm on the supervised fault stack (fp32): 60 clients cancel their Generate call
mid-transfer (during StreamPrefill, during the KV send, right after the first token) while
8 other streams run to completion. Nothing else fails; the completed outputs equal an offline
fp32 reference token for token (a late write into a reused block would change them); no block
and no reservation is held after the drain. bench-faults runs 1,000 (docs/chaos.md)."""

import pytest

from benchmarks.fault_load import StreamingLoad, failures
from benchmarks.harness.abort_storm import (
    abort_storm, completed_pairs, first_token_wait_s, late_writes_refused, wrong_outputs)
from benchmarks.harness.peer_churn import ready_info_of

NUM_ABORTS = 60
PROMPT_TOKENS = 200
MAX_TOKENS = 16


@pytest.fixture
def stack(faults_stack):
    return faults_stack


def decode_metrics(stack) -> list[str]:
    return [ready_info_of(child)["metrics_address"] for child in stack.stack.instances if child.role == "decode"]


def test_aborts_mid_transfer_leave_completed_outputs_right_and_nothing_held(stack, smollm2_folder):
    names = {child.name for child in stack.stack.instances}
    stack.wait_for(lambda: stack.registered_ids() == names, 120.0, "every instance registered")
    first_token_s = first_token_wait_s(stack.gateway, PROMPT_TOKENS)
    refused_before = late_writes_refused(decode_metrics(stack))
    with StreamingLoad(stack.gateway, 8, 4, seed=60, prompt_tokens=(100, 300), max_tokens=MAX_TOKENS) as load:
        storm = abort_storm(stack.gateway, NUM_ABORTS, 4, PROMPT_TOKENS, MAX_TOKENS, first_token_s, seed=61)
        results = load.results()
    assert failures(results) == []
    assert storm.num_aborts == NUM_ABORTS and not storm.errors, storm
    stack.wait_all_blocks_free(60.0)
    stack.wait_for(lambda: all(s.num_reserved == 0 for s in stack.statuses("decode").values()), 60.0,
                   "no reservation left")
    assert wrong_outputs(completed_pairs(load, results), str(smollm2_folder), MAX_TOKENS) == []
    refused = late_writes_refused(decode_metrics(stack)) - refused_before
    print(f"aborts by phase {dict(storm.by_phase)}, done before the cancel {storm.num_done_before_abort}, "
          f"late writes refused {dict(refused)}")
