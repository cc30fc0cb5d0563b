"""Benchmark workloads: lengths in range, seeded reproducibility, shared prefixes, JSONL files,
and the Poisson arrival schedule."""

import json
import math
import statistics

import pytest

from services.bench.arrivals import arrival_offsets
from services.bench.datasets import LengthRange, file_dataset, random_dataset, shared_prefix_dataset
from services.bench.vocabulary import usable_token_ids, with_prompt_text
from shared.errors import ConfigurationError
from tests.unit.conftest_tokenizer import smollm2_tokenizer  # noqa: F401 - fixture

VOCAB = list(range(3, 1000))


def test_random_prompts_have_lengths_in_range_and_repeat_with_the_seed():
    prompts = random_dataset(200, LengthRange(128, 256), LengthRange(16, 32), VOCAB, seed=7)
    assert all(128 <= p.prompt_len <= 256 and 16 <= p.output_len <= 32 for p in prompts)
    assert len({p.prompt_len for p in prompts}) > 50  # spread over the range, not one length
    assert all(set(p.prompt_token_ids) <= set(VOCAB) for p in prompts)
    assert prompts == random_dataset(200, LengthRange(128, 256), LengthRange(16, 32), VOCAB, seed=7)
    assert prompts != random_dataset(200, LengthRange(128, 256), LengthRange(16, 32), VOCAB, seed=8)


def test_fixed_lengths_and_bad_ranges():
    prompts = random_dataset(3, LengthRange.parse([5], "x"), LengthRange.parse([2], "y"), VOCAB, seed=0)
    assert [(p.prompt_len, p.output_len) for p in prompts] == [(5, 2)] * 3
    with pytest.raises(ConfigurationError, match=r"random-input-len: needs 1 <= low <= high, got 9 3"):
        LengthRange.parse([9, 3], "random-input-len")
    with pytest.raises(ConfigurationError, match=r"output-len: takes LEN or LOW HIGH, got \[1, 2, 3\]"):
        LengthRange.parse([1, 2, 3], "output-len")


def test_shared_prefix_prompts_really_share_their_prefix():
    prompts = shared_prefix_dataset(8, num_prefixes=2, prefix_len=64, suffix_len=16,
                                    output_len=LengthRange(4, 4), token_ids=VOCAB, seed=1)
    assert all(p.prompt_len == 80 for p in prompts)
    first, second = prompts[0].prompt_token_ids[:64], prompts[1].prompt_token_ids[:64]
    assert first != second
    assert all(p.prompt_token_ids[:64] == (first if i % 2 == 0 else second) for i, p in enumerate(prompts))
    assert len({tuple(p.prompt_token_ids[64:]) for p in prompts}) == 8  # every suffix its own


def test_usable_vocabulary_excludes_special_tokens(smollm2_tokenizer):  # noqa: F811
    token_ids = usable_token_ids(smollm2_tokenizer)
    special = set(smollm2_tokenizer.all_special_ids)
    assert special and not special & set(token_ids)
    assert len(token_ids) == len(smollm2_tokenizer) - len(special)


def test_jsonl_file_prompts_with_and_without_output_len(tmp_path, smollm2_tokenizer):  # noqa: F811
    path = tmp_path / "prompts.jsonl"
    path.write_text(json.dumps({"prompt": "Hello there", "output_len": 5}) + "\n\n"
                    + json.dumps({"prompt_token_ids": [11, 12, 13]}) + "\n")
    prompts = file_dataset(path, smollm2_tokenizer, LengthRange(9, 9), num_prompts=None, seed=0)
    assert prompts[0].prompt_token_ids == smollm2_tokenizer.encode("Hello there", add_special_tokens=False)
    assert (prompts[0].output_len, prompts[0].prompt_text) == (5, "Hello there")
    assert (prompts[1].prompt_token_ids, prompts[1].output_len) == ([11, 12, 13], 9)
    assert with_prompt_text(prompts, smollm2_tokenizer)[1].prompt_text == smollm2_tokenizer.decode([11, 12, 13])
    path.write_text('{"text": "no prompt"}\n')
    with pytest.raises(ConfigurationError, match='dataset-path line 1: needs "prompt" or "prompt_token_ids"'):
        file_dataset(path, smollm2_tokenizer, LengthRange(9, 9), None, 0)


def test_poisson_arrivals_are_seeded_and_keep_the_mean_rate():
    offsets = arrival_offsets(2000, request_rate=4.0, seed=3)
    assert offsets[0] == 0.0 and offsets == sorted(offsets)
    assert offsets == arrival_offsets(2000, request_rate=4.0, seed=3)
    gaps = [b - a for a, b in zip(offsets, offsets[1:])]
    assert statistics.mean(gaps) == pytest.approx(0.25, rel=0.05)
    assert statistics.stdev(gaps) == pytest.approx(0.25, rel=0.1)  # exponential: stdev = mean
    even = arrival_offsets(2000, request_rate=4.0, burstiness=100.0, seed=3)
    assert statistics.stdev([b - a for a, b in zip(even, even[1:])]) < 0.05


def test_infinite_rate_sends_everything_at_once_and_bad_rates_are_refused():
    assert arrival_offsets(3, math.inf) == [0.0, 0.0, 0.0]
    with pytest.raises(ConfigurationError, match="request-rate: must be > 0 or inf, got 0"):
        arrival_offsets(3, 0)
    with pytest.raises(ConfigurationError, match="burstiness: must be > 0, got -1"):
        arrival_offsets(3, 1.0, burstiness=-1)


def test_each_run_of_a_sweep_gets_its_own_prompts_and_the_warm_up_others(smollm2_tokenizer):  # noqa: F811
    from services.bench.workload import WorkloadSpec, sweep_workloads

    spec = WorkloadSpec(num_prompts=3, input_len=LengthRange(8, 16), output_len=LengthRange(4, 4), seed=5)
    warmup, runs = sweep_workloads(spec, smollm2_tokenizer, num_runs=2, num_warmups=2)
    assert len(warmup) == 2 and [len(prompts) for prompts in runs] == [3, 3]
    all_prompts = [tuple(p.prompt_token_ids) for p in warmup + runs[0] + runs[1]]
    assert len(set(all_prompts)) == 8  # no prompt repeated: no prefix-cache hit between runs
    assert sweep_workloads(spec, smollm2_tokenizer, 2, 2) == (warmup, runs)
