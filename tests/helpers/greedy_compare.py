"""Comparing greedy outputs of differently batched bf16 runs, without luck.

bf16 logits move by a few hundredths to tenths between batch shapes, cache hits and
chunkings, so two correct greedy runs may part ways where the two best tokens are nearly
tied. `assert_greedy_agrees` accepts a divergence only there: the offline reference, given
the common prefix, must rate the two tokens within `NEAR_TIE_NATS` of each other; anywhere
else a difference is a real bug and fails. Under guided decoding "best" means best among the
tokens the grammar allows, which the model may rank far down; a test of guided output also
checks that every token was allowed (tests/helpers/grammar_walk.py), since a near-tie says
nothing about that.
"""

from shared.engine import LLM, SamplingParams

NEAR_TIE_NATS = 0.5


def first_difference(got: list[int], expected: list[int]) -> int | None:
    for position, (a, b) in enumerate(zip(got, expected)):
        if a != b:
            return position
    return None if len(got) == len(expected) else min(len(got), len(expected))


def logprob_gap(reference: LLM, prefix: list[int], token_a: int, token_b: int) -> float:
    """|log p(a) - log p(b)| of the next token after `prefix`, by the reference, whatever the
    two tokens' ranks: each is scored as the last prompt token (prompt logprobs). Under guided
    decoding the grammar may allow only tokens the model ranks far down (a choice's letters
    after its first token), and masking leaves the gap between two allowed tokens unchanged."""
    if token_a == token_b:
        return 0.0
    scored = reference.generate([prefix + [token_a], prefix + [token_b]],
                                SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=0))
    logprob_a, logprob_b = (output.prompt_logprobs[-1].logprob for output in scored)
    return abs(logprob_a - logprob_b)


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
