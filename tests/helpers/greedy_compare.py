"""Comparing greedy outputs of differently batched bf16 runs, without luck.

bf16 logits move by a few hundredths to tenths between batch shapes, cache hits and
chunkings, so two correct greedy runs may part ways where the two best tokens are nearly
tied. `assert_greedy_agrees` accepts a divergence only there: the offline reference, given
the common prefix, must rate the two tokens within `NEAR_TIE_NATS` of each other; anywhere
else a difference is a real bug and fails.
"""

from shared.engine import LLM, SamplingParams

NEAR_TIE_NATS = 0.5
TOP_LOGPROBS = 20


def first_difference(got: list[int], expected: list[int]) -> int | None:
    for position, (a, b) in enumerate(zip(got, expected)):
        if a != b:
            return position
    return None if len(got) == len(expected) else min(len(got), len(expected))


def logprob_gap(reference: LLM, prefix: list[int], token_a: int, token_b: int) -> float:
    """|log p(a) - log p(b)| of the next token after `prefix`, by the reference (inf when
    either is not among its top TOP_LOGPROBS)."""
    [output] = reference.generate([prefix], SamplingParams(temperature=0, max_tokens=1, logprobs=TOP_LOGPROBS))
    top = dict(output.outputs[0].logprobs[0].top)
    if token_a not in top or token_b not in top:
        return float("inf")
    return abs(top[token_a] - top[token_b])


def assert_greedy_agrees(reference: LLM, prompt_ids: list[int], got: list[int], expected: list[int]) -> None:
    """`got` equals `expected`, or they part at a near-tie of the reference's (then the rest
    cannot be compared: each run continues its own way)."""
    position = first_difference(got, expected)
    if position is None:
        return
    assert position < min(len(got), len(expected)), f"one output is a prefix of the other: {got} vs {expected}"
    gap = logprob_gap(reference, prompt_ids + got[:position], got[position], expected[position])
    assert gap < NEAR_TIE_NATS, (f"greedy outputs part at position {position} ({got[position]} vs "
                                 f"{expected[position]}) where the reference prefers one by {gap:.3f} nats")
