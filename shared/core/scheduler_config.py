"""The scheduler's settings (a part of shared.config.EngineConfig)."""

from dataclasses import dataclass


@dataclass
class SchedulerConfig:
    # Most sequences running at once (the decode batch size bound).
    max_num_seqs: int = 128
    # Most tokens one step computes, decodes and prompt chunks together.
    max_num_batched_tokens: int = 2048
    # Split long prompts across steps instead of waiting for a step with room.
    enable_chunked_prefill: bool = True
    # Cap on one prompt's chunk per step (0 = the whole budget), so that several
    # prompts can share a step's budget.
    long_prefill_token_threshold: int = 0
    # Prompts competing in a step share its budget equally (see shared.core.scheduler);
    # False: first come takes all (benchmarks compare the two).
    fair_prefill: bool = True
    # Most prompts one step's budget is shared among (fair prefill): the first ones to arrive.
    # The rest wait their turn, so a burst's first tokens come out one group after another
    # instead of all at the end; a short prompt still gets in beside long part-way ones.
    max_num_partial_prefills: int = 4
