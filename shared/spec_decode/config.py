"""Speculative decoding settings: which proposer, how many tokens, which draft model.

Read by `shared.engine.loading` (builds the proposer), the scheduler (how many slots to
allocate for proposals) and the engine (statistics). `method` "none" turns it all off.
"""

from dataclasses import dataclass

from shared.errors import ConfigurationError

SPECULATIVE_METHODS = ("none", "ngram", "draft")
MAX_SPECULATIVE_TOKENS = 16


@dataclass
class SpeculativeConfig:
    # "none", "ngram" (prompt lookup, no model) or "draft" (a smaller model).
    speculative_method: str = "none"
    # Most tokens proposed per request and step (k).
    num_speculative_tokens: int = 3
    # Draft method: an HF Llama folder sharing the target's tokenizer; None = the target's own
    # folder, truncated to `draft_num_layers`.
    draft_model: str | None = None
    # Draft method: keep only the first N decoder layers of the draft (+ final norm + LM head);
    # None = all of them (required when draft_model is None).
    draft_num_layers: int | None = None
    # N-gram method: the longest and shortest suffix n-grams looked up earlier in the sequence.
    ngram_max: int = 4
    ngram_min: int = 1

    def __post_init__(self) -> None:
        self.validate()

    @property
    def is_enabled(self) -> bool:
        return self.speculative_method != "none"

    @property
    def num_tokens_per_step(self) -> int:
        """k when speculation is on, else 0."""
        return self.num_speculative_tokens if self.is_enabled else 0

    def validate(self) -> None:
        """Raise ConfigurationError naming the first bad setting."""
        if self.speculative_method not in SPECULATIVE_METHODS:
            raise ConfigurationError("speculative_method", f"must be one of {SPECULATIVE_METHODS}, "
                                                            f"got {self.speculative_method!r}")
        if not 1 <= self.num_speculative_tokens <= MAX_SPECULATIVE_TOKENS:
            raise ConfigurationError("num_speculative_tokens", f"must be in [1, {MAX_SPECULATIVE_TOKENS}], "
                                                                f"got {self.num_speculative_tokens}")
        if self.draft_num_layers is not None and self.draft_num_layers < 1:
            raise ConfigurationError("draft_num_layers", f"must be >= 1, got {self.draft_num_layers}")
        if self.speculative_method == "draft" and not self.draft_model and self.draft_num_layers is None:
            raise ConfigurationError("draft_num_layers", "the draft method needs draft_model or "
                                                          "draft_num_layers (the target truncated)")
        if not 1 <= self.ngram_min <= self.ngram_max:
            raise ConfigurationError("ngram_min", f"must be in [1, ngram_max={self.ngram_max}], "
                                                   f"got {self.ngram_min}")
