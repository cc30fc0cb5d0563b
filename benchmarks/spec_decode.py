"""Speculative decoding benchmark: decode tokens/s with and without speculation, by batch size.

Run by `make bench-spec` (`python -m benchmarks.spec_decode [flags]`).

Workload: chat prompts that ask SmolLM2 to repeat or lightly edit a given paragraph, greedy
(where prompt lookup should help, and where a draft model's guesses are easiest). For each
batch size the same prompts run on a plain engine and on each speculating engine (n-gram,
and a draft made of the target's first layers); the output tokens are the same (greedy), so
decode tokens/s compare directly. Decode time is the generation wall time minus the time of
the same batches with max_tokens=1 (prefill and first token); batches smaller than
--min-prompts run one after another over different prompts. Best of --repeats runs, the
engines taking turns. Prints
the acceptance rate per draft position for each speculating engine.
"""

import argparse
import os
import time
from dataclasses import dataclass

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from shared.engine import LLM, SamplingParams  # noqa: E402
from shared.model.default_model import resolve_model  # noqa: E402
from shared.spec_decode.stats import SpecDecodeStats  # noqa: E402
from benchmarks.engine_flags import add_engine_arguments, engine_args_from  # noqa: E402

PARAGRAPHS = [
    "The library opens at nine in the morning and closes at six in the evening. Visitors must "
    "leave their bags at the entrance and show a valid card to borrow books.",
    "To make the soup, chop two onions and three carrots, fry them in olive oil for five "
    "minutes, add a litre of water and a pinch of salt, then simmer for half an hour.",
    "The train to the coast leaves from platform four every hour. Tickets can be bought at the "
    "machines in the hall or from the conductor, who accepts cash and cards.",
    "Our team meets every Monday to plan the week. Each person shares what they finished, what "
    "they will work on next, and anything that is blocking their progress.",
    "The garden has three apple trees, a small pond with goldfish, and a wooden bench under the "
    "old oak tree where my grandmother liked to read in the afternoon.",
    "Please remember to switch off the lights, close all the windows, and lock the back door "
    "before you leave the office at the end of the day.",
    "The museum's new exhibition shows paintings from the early twentieth century, including "
    "landscapes, portraits and several large works that were never displayed before.",
    "Water boils at one hundred degrees Celsius at sea level, but at higher altitudes the air "
    "pressure is lower, so it boils at a lower temperature.",
]
INSTRUCTIONS = [
    "Repeat the following text exactly:\n\n{}",
    "Copy this paragraph word for word:\n\n{}",
    "Rewrite the text below, changing only the first word:\n\n{}",
    "Repeat this text twice:\n\n{}",
    "Fix any typos in the following text and return it in full:\n\n{}",
    "Return the following text unchanged:\n\n{}",
    "Rewrite this text in the past tense:\n\n{}",
    "Echo back the paragraph below:\n\n{}",
]


@dataclass
class Measurement:
    label: str
    batch_size: int
    num_sequences: int
    num_output_tokens: int
    decode_s: float
    stats: SpecDecodeStats | None

    @property
    def decode_tokens_per_s(self) -> float:
        return (self.num_output_tokens - self.num_sequences) / self.decode_s


def make_batches(batch_size: int, min_prompts: int) -> list[list[list[dict]]]:
    """Consecutive batches of distinct conversations, at least `min_prompts` in all; instructions
    and paragraphs are interleaved so every batch mixes exact copies and edits."""
    num_prompts = len(INSTRUCTIONS) * len(PARAGRAPHS)
    prompts = [INSTRUCTIONS[index % len(INSTRUCTIONS)].format(PARAGRAPHS[(index + index // 8) % len(PARAGRAPHS)])
               for index in range(num_prompts)]
    num_batches = max(1, -(-min_prompts // batch_size))
    return [[[{"role": "user", "content": prompts[(start + offset) % num_prompts]}] for offset in range(batch_size)]
            for start in range(0, num_batches * batch_size, batch_size)]


def run_once(llm: LLM, batches, params: SamplingParams) -> tuple[float, int]:
    """(wall seconds, output tokens) of generating every batch, one after the other."""
    started = time.perf_counter()
    outputs = [output for batch in batches for output in llm.chat(batch, params)]
    return time.perf_counter() - started, sum(len(output.outputs[0].token_ids) for output in outputs)


def measure_all(llms: dict[str, LLM], batch_size: int, args) -> list[Measurement]:
    """Every engine on the same batches; repeats interleave the engines, so that a busy
    moment on a shared machine hits them alike, and the best run of each counts."""
    batches = make_batches(batch_size, args.min_prompts)
    first_token = SamplingParams(temperature=0, max_tokens=1)
    full = SamplingParams(temperature=0, max_tokens=args.max_tokens)
    before = {label: _copy_stats(llm) for label, llm in llms.items()}
    best_prefill = dict.fromkeys(llms, float("inf"))
    best_total = dict.fromkeys(llms, float("inf"))
    num_tokens = {}
    for _ in range(args.repeats):
        for label, llm in llms.items():
            best_prefill[label] = min(best_prefill[label], run_once(llm, batches, first_token)[0])
            seconds, num_tokens[label] = run_once(llm, batches, full)
            best_total[label] = min(best_total[label], seconds)
    num_sequences = len(batches) * batch_size
    return [Measurement(label, batch_size, num_sequences, num_tokens[label],
                        max(best_total[label] - best_prefill[label], 1e-9), _stats_since(llm, before[label]))
            for label, llm in llms.items()]


def _copy_stats(llm: LLM) -> SpecDecodeStats:
    stats = llm.engine.core.spec_stats
    return SpecDecodeStats(stats.num_drafts, stats.num_draft_tokens, stats.num_accepted_tokens,
                           list(stats.accepted_per_position), list(stats.proposed_per_position))


def _stats_since(llm: LLM, before: SpecDecodeStats) -> SpecDecodeStats | None:
    now = llm.engine.core.spec_stats
    if now.num_drafts == before.num_drafts:
        return None
    def minus(a: list[int], b: list[int]) -> list[int]:
        return [x - (b[i] if i < len(b) else 0) for i, x in enumerate(a)]
    return SpecDecodeStats(now.num_drafts - before.num_drafts, now.num_draft_tokens - before.num_draft_tokens,
                           now.num_accepted_tokens - before.num_accepted_tokens,
                           minus(now.accepted_per_position, before.accepted_per_position),
                           minus(now.proposed_per_position, before.proposed_per_position))


def engines(args) -> dict[str, dict]:
    configs = {"plain": {}}
    if "ngram" in args.methods:
        configs[f"ngram k={args.ngram_k}"] = dict(speculative_method="ngram", num_speculative_tokens=args.ngram_k)
    if "draft" in args.methods:
        configs[f"draft {args.draft_num_layers}L k={args.draft_k}"] = dict(
            speculative_method="draft", draft_num_layers=args.draft_num_layers, num_speculative_tokens=args.draft_k)
    return configs


def print_row(measurement: Measurement, baseline: Measurement) -> None:
    speedup = measurement.decode_tokens_per_s / baseline.decode_tokens_per_s
    line = (f"{measurement.batch_size:>5} {measurement.label:<18} {measurement.num_output_tokens:>7} "
            f"{measurement.decode_s:>8.2f} {measurement.decode_tokens_per_s:>9.1f} {speedup:>7.2f}x")
    stats = measurement.stats
    if stats is not None:
        per_position = " ".join(f"{rate:.2f}" for rate in stats.acceptance_rate_per_position())
        line += f"  accept {stats.acceptance_rate:.2f} [{per_position}] {stats.mean_accepted_per_draft:.2f}/draft"
    print(line, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_engine_arguments(parser, "model", "dtype", "num_threads", num_threads=2)
    parser.add_argument("--batch-sizes", default="1,4,16,64")
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--min-prompts", type=int, default=8,
                        help="smaller batches run one after another until this many prompts ran")
    parser.add_argument("--methods", default="ngram,draft")
    parser.add_argument("--ngram-k", type=int, default=4)
    parser.add_argument("--draft-k", type=int, default=3)
    parser.add_argument("--draft-num-layers", type=int, default=8)
    args = parser.parse_args()
    folder = str(resolve_model(args.model))
    llms = {label: LLM.from_engine_args(engine_args_from(args, model=folder, **config))
            for label, config in engines(args).items()}
    from benchmarks.machine import print_machine

    print_machine(next(iter(llms.values())).engine.core.executor.compute_paths)
    print(f"{'batch':>5} {'engine':<18} {'out tok':>7} {'decode s':>8} {'tok/s':>9} {'speedup':>8}")
    for batch_size in map(int, args.batch_sizes.split(",")):
        measurements = measure_all(llms, batch_size, args)
        for measurement in measurements:
            print_row(measurement, measurements[0])


if __name__ == "__main__":
    main()
