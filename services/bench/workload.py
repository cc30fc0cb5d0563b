"""A workload described by flags (dataset name and its lengths) turned into BenchPrompts.

Called by the bench command and benchmarks/serve_compare.py, once before the runs.
"""

from dataclasses import dataclass, field, replace
from pathlib import Path

from services.bench.datasets import (BenchPrompt, LengthRange, file_dataset, random_dataset,
                                   shared_prefix_dataset)
from services.bench.vocabulary import usable_token_ids, with_prompt_text
from shared.errors import ConfigurationError

DATASETS = ("random", "shared-prefix", "file")


@dataclass(frozen=True)
class WorkloadSpec:
    dataset: str = "random"
    num_prompts: int = 64
    input_len: LengthRange = field(default_factory=lambda: LengthRange(128, 256))
    output_len: LengthRange = field(default_factory=lambda: LengthRange(128, 128))
    num_prefixes: int = 4
    prefix_len: int = 512
    suffix_len: int = 64
    dataset_path: Path | None = None
    seed: int = 0


def build_workload(spec: WorkloadSpec, tokenizer, needs_text: bool = False) -> list[BenchPrompt]:
    """The prompts `spec` describes; `needs_text` fills in prompt text (chat backends)."""
    if spec.num_prompts < 1:
        raise ConfigurationError("num-prompts", f"must be >= 1, got {spec.num_prompts}")
    if spec.dataset == "random":
        prompts = random_dataset(spec.num_prompts, spec.input_len, spec.output_len,
                                 usable_token_ids(tokenizer), spec.seed)
    elif spec.dataset == "shared-prefix":
        prompts = shared_prefix_dataset(spec.num_prompts, spec.num_prefixes, spec.prefix_len,
                                        spec.suffix_len, spec.output_len, usable_token_ids(tokenizer), spec.seed)
    elif spec.dataset == "file":
        if spec.dataset_path is None:
            raise ConfigurationError("dataset-path", "is required with --dataset-name file")
        prompts = file_dataset(spec.dataset_path, tokenizer, spec.output_len, spec.num_prompts, spec.seed)
    else:
        raise ConfigurationError("dataset-name", f"unknown dataset {spec.dataset!r} (use {', '.join(DATASETS)})")
    return with_prompt_text(prompts, tokenizer) if needs_text else prompts


def sweep_workloads(spec: WorkloadSpec, tokenizer, num_runs: int, num_warmups: int,
                    needs_text: bool = False) -> tuple[list[BenchPrompt], list[list[BenchPrompt]]]:
    """(warm-up prompts, one prompt set per run): each built with its own seed (spec.seed + i),
    so no run reuses another's prompts and gets prefix-cache hits a fresh workload would not.
    A file dataset is the same for every run."""
    runs = [build_workload(replace(spec, seed=spec.seed + index), tokenizer, needs_text) for index in range(num_runs)]
    warmup_spec = replace(spec, seed=spec.seed + num_runs, num_prompts=max(1, num_warmups))
    return build_workload(warmup_spec, tokenizer, needs_text)[:num_warmups], runs
