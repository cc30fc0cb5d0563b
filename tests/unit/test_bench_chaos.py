"""The chaos benchmark's bookkeeping: what counts as ok, failed with a clear error or lost; the
fp32 rescoring verdict; latency windows; the seeded fault schedule's kinds."""

import argparse

import pytest

from benchmarks import chaos
from benchmarks.chaos_load import FAILED, LOST, OK, ChaosResult
from benchmarks.chaos_report import FlaggedToken, flagged_tokens, latency_windows, outcomes, rescore
from shared.engine_api.outputs import SampledLogprobs
from shared.pb.pdserve.v1 import generation_pb2

TIMEOUT_S = 100.0


def result(**fields) -> ChaosResult:
    values = dict(index=0, gateway=0, prompt_ids=[1, 2, 3], max_tokens=2, started_at=10.0, ended_at=12.0)
    return ChaosResult(**{**values, **fields})


def test_outcomes_tell_clear_failures_from_lost_requests():
    finished = dict(token_ids=[5, 6], completion_tokens=2, finish_reason=generation_pb2.FINISH_REASON_LENGTH)
    cases = [
        (result(**finished), OK),
        (result(token_ids=[5, 6], completion_tokens=3, finish_reason=generation_pb2.FINISH_REASON_LENGTH), LOST),
        (result(token_ids=[5]), LOST),  # ended without a finish reason or an error
        (result(code="RESOURCE_EXHAUSTED", details="overloaded: ..."), FAILED),
        (result(code="UNAVAILABLE", details="decode instance decode-1: connection refused"), FAILED),
        (result(code="UNAVAILABLE", details=""), LOST),
        (result(code="UNKNOWN", details="Exception iterating responses"), LOST),
        (result(code="DEADLINE_EXCEEDED", details="Deadline Exceeded", ended_at=10.0 + TIMEOUT_S), LOST),
        (result(code="DEADLINE_EXCEEDED", details="prefill: Deadline Exceeded", ended_at=40.0), FAILED),
    ]
    for case, expected in cases:
        assert case.outcome(TIMEOUT_S) == expected, case
    assert outcomes([case for case, _ in cases], TIMEOUT_S) == {OK: 1, FAILED: 3, LOST: 5}


def scored(*entries: tuple[float, int, float]) -> list[SampledLogprobs]:
    """Prompt logprobs of a 3-token prompt followed by the output: (logprob, best id, best logprob)."""
    prompt = [SampledLogprobs(-1.0, [(2, -1.0)]), SampledLogprobs(-1.0, [(3, -1.0)])]
    return prompt + [SampledLogprobs(logprob, [(best_id, best)]) for logprob, best_id, best in entries]


def test_a_token_is_flagged_only_when_the_scoring_model_prefers_another_by_more_than_a_near_tie():
    output = result(token_ids=[5, 6])
    assert flagged_tokens(output, scored((-0.1, 5, -0.1), (-0.2, 6, -0.2))) == []
    assert flagged_tokens(output, scored((-0.1, 5, -0.1), (-0.6, 9, -0.3))) == []  # a near-tie
    [flagged] = flagged_tokens(output, scored((-0.1, 5, -0.1), (-4.0, 9, -0.3)))
    assert "output token 1 is 6, fp32 prefers 9 by 3.70 nats" in flagged.line("fp32")


def test_a_token_is_wrong_only_when_the_serving_dtype_alone_rejects_it_too():
    finished = dict(token_ids=[5, 6, 7], completion_tokens=3, finish_reason=generation_pb2.FINISH_REASON_LENGTH)
    outputs = [result(index=i, **finished) for i in range(3)]
    by_dtype = {  # request index -> flagged positions, per scoring dtype
        "float32": {0: [], 1: [1], 2: [0, 2]},
        "bfloat16": {1: [], 2: [2]},  # bf16 itself chooses request 1's token 1 and request 2's token 0
    }

    def fake_flags(results, model, dtype, batch):
        assert dtype == "float32" or [r.index for r in results] == [1, 2]  # only fp32's suspects again
        return {r.index: [FlaggedToken(r.index, p, 5, 9, 1.0) for p in by_dtype[dtype][r.index]] for r in results}

    scored = rescore(outputs, "model", "bfloat16", flag_outputs=fake_flags)
    assert scored.num_scored == 3
    assert [(f.request, f.position) for f in scored.wrong] == [(2, 2)]
    assert sorted((f.request, f.position) for f in scored.dtype_disagreements) == [(1, 1), (2, 0)]


def test_latency_windows_place_first_tokens_and_gaps_by_when_they_came():
    results = [result(started_at=100.0, ttft_s=0.5, gaps=[(101.0, 0.1), (135.0, 0.3)]),
               result(started_at=131.0, ttft_s=2.0, gaps=[])]
    windows = latency_windows(results, started_at=100.0, window_s=30.0)
    assert [w["num_first_tokens"] for w in windows] == [1, 1]
    assert windows[0]["ttft_p99_ms"] == pytest.approx(500.0) and windows[1]["ttft_p99_ms"] == pytest.approx(2000.0)
    assert windows[0]["itl_p50_ms"] == pytest.approx(100.0) and windows[1]["itl_p99_ms"] == pytest.approx(300.0)


def test_kinds_filter_keeps_matching_fault_kinds_and_refuses_none():
    args = argparse.Namespace(kinds="kill -9 decode,overload")
    assert [name for name, _ in chaos.fault_kinds(args)] == ["kill -9 decode", "overload burst"]
    with pytest.raises(SystemExit):
        chaos.fault_kinds(argparse.Namespace(kinds="no such fault"))
