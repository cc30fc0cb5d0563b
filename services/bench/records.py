"""What a client records about one request while it streams (filled by clients/, read by metrics)."""

from dataclasses import dataclass, field


@dataclass
class RequestRecord:
    """Times are seconds: `start_s` from the benchmark's start, the rest from `start_s`.

    `chunk_times_s[i]` is when the i-th streamed message carrying tokens arrived and
    `chunk_num_tokens[i]` how many tokens it carried; `end_s` is when the stream ended.
    """

    index: int
    prompt_len: int
    expected_output_len: int
    start_s: float = 0.0
    chunk_times_s: list[float] = field(default_factory=list)
    chunk_num_tokens: list[int] = field(default_factory=list)
    end_s: float = 0.0
    # Completion tokens as the server reports them (usage), when it does.
    reported_output_len: int | None = None
    error: str | None = None

    @property
    def is_success(self) -> bool:
        return self.error is None and bool(self.chunk_times_s)

    @property
    def num_output_tokens(self) -> int:
        if self.reported_output_len is not None:
            return self.reported_output_len
        return sum(self.chunk_num_tokens)

    def add_chunk(self, elapsed_s: float, num_tokens: int) -> None:
        """Called by a client for each streamed message that carries at least one token."""
        if num_tokens > 0:
            self.chunk_times_s.append(elapsed_s)
            self.chunk_num_tokens.append(num_tokens)
