"""Benchmark workloads: lists of BenchPrompt built from a seed, so runs are reproducible.

Called by `pdserve bench serve` and benchmarks/serve_compare.py before any request is sent.
Random prompts draw token ids uniformly from the vocabulary minus its special tokens.
"""

import json
import random
from dataclasses import dataclass
from pathlib import Path

from shared.errors import ConfigurationError


@dataclass(frozen=True)
class BenchPrompt:
    """One request of a workload: its prompt (token ids, plus text for chat/text backends)
    and how many tokens it should generate."""

    prompt_token_ids: list[int]
    output_len: int
    prompt_text: str | None = None

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_token_ids)


@dataclass(frozen=True)
class LengthRange:
    """An inclusive [low, high] token count; lengths are drawn uniformly from it."""

    low: int
    high: int

    def __post_init__(self) -> None:
        if not 1 <= self.low <= self.high:
            raise ConfigurationError("length range", f"needs 1 <= low <= high, got {self.low} {self.high}")

    @classmethod
    def parse(cls, values: list[int], field: str) -> "LengthRange":
        """From a flag's one value (fixed) or two values (low high)."""
        if len(values) not in (1, 2):
            raise ConfigurationError(field, f"takes LEN or LOW HIGH, got {values}")
        try:
            return cls(values[0], values[-1])
        except ConfigurationError as error:
            raise ConfigurationError(field, error.message) from None

    def draw(self, rng: random.Random) -> int:
        return rng.randint(self.low, self.high)


def random_dataset(num_prompts: int, input_len: LengthRange, output_len: LengthRange,
                   token_ids: list[int], seed: int) -> list[BenchPrompt]:
    """`num_prompts` prompts of random token ids (drawn from `token_ids`, the usable vocabulary)."""
    rng = random.Random(seed)
    prompts = []
    for _ in range(num_prompts):
        prompt_len = input_len.draw(rng)
        prompt_ids = [rng.choice(token_ids) for _ in range(prompt_len)]
        prompts.append(BenchPrompt(prompt_ids, output_len.draw(rng)))
    return prompts


def shared_prefix_dataset(num_prompts: int, num_prefixes: int, prefix_len: int, suffix_len: int,
                          output_len: LengthRange, token_ids: list[int], seed: int) -> list[BenchPrompt]:
    """`num_prompts` prompts, prompt i = prefix (i % num_prefixes) + its own random suffix:
    many requests sharing a few long system prompts, as prefix caching sees them."""
    if num_prefixes < 1 or prefix_len < 0 or suffix_len < 1:
        raise ConfigurationError("shared-prefix", "needs num_prefixes >= 1, prefix_len >= 0, suffix_len >= 1")
    rng = random.Random(seed)
    prefixes = [[rng.choice(token_ids) for _ in range(prefix_len)] for _ in range(num_prefixes)]
    prompts = []
    for index in range(num_prompts):
        suffix = [rng.choice(token_ids) for _ in range(suffix_len)]
        prompts.append(BenchPrompt(prefixes[index % num_prefixes] + suffix, output_len.draw(rng)))
    return prompts


def file_dataset(path: Path, tokenizer, default_output_len: LengthRange, num_prompts: int | None,
                 seed: int) -> list[BenchPrompt]:
    """Prompts from a JSONL file, one object a line: {"prompt": text} or {"prompt_token_ids":
    [...]}, with an optional "output_len". Text is tokenized with `tokenizer`."""
    rng = random.Random(seed)
    prompts = []
    for line_number, line in enumerate(Path(path).read_text().splitlines(), start=1):
        if line.strip():
            prompts.append(_prompt_from_line(line, line_number, tokenizer, default_output_len, rng))
    if not prompts:
        raise ConfigurationError("dataset-path", f"{path} has no prompts")
    return prompts if num_prompts is None else prompts[:num_prompts]


def _prompt_from_line(line: str, line_number: int, tokenizer, default_output_len: LengthRange,
                      rng: random.Random) -> BenchPrompt:
    field = f"dataset-path line {line_number}"
    try:
        entry = json.loads(line)
    except ValueError as error:
        raise ConfigurationError(field, f"is not JSON: {error}") from None
    if not isinstance(entry, dict) or not ({"prompt", "prompt_token_ids"} & entry.keys()):
        raise ConfigurationError(field, 'needs "prompt" or "prompt_token_ids"')
    output_len = entry.get("output_len", default_output_len.draw(rng))
    if not isinstance(output_len, int) or output_len < 1:
        raise ConfigurationError(field, f"output_len must be a positive integer, got {output_len!r}")
    if "prompt_token_ids" in entry:
        return BenchPrompt(list(entry["prompt_token_ids"]), output_len, entry.get("prompt"))
    text = entry["prompt"]
    return BenchPrompt(tokenizer.encode(text, add_special_tokens=False), output_len, text)
