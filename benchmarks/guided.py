"""Guided decoding benchmark: per-token mask cost, and constrained vs free batch throughput.

Run by `make bench-guided` (`python -m benchmarks.guided [flags]`).

Part 1 (no model, the real SmolLM2 tokenizer, vocab 49152): for each constraint a valid output
is tokenized and replayed through an XGrammar matcher; per token it times the bitmask fill
(mask computation), its application to a logits row, and the matcher's advance.
Part 2 (the real model): the same prompts generated as one batch, free and under a JSON schema,
greedy, and output tokens/s compared.
"""

import argparse
import json
import os
import statistics
import time
from dataclasses import dataclass

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402
import xgrammar as xgr  # noqa: E402

from shared.guided import GuidedDecodingParams  # noqa: E402
from shared.guided.bitmask import apply_token_bitmasks, fill_bitmask  # noqa: E402
from shared.guided.compiler import GrammarCache, tokenizer_info  # noqa: E402
from benchmarks.engine_flags import add_engine_arguments, engine_args_from  # noqa: E402

PERSON_SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string"}, "age": {"type": "integer"},
    "address": {"type": "object", "properties": {"city": {"type": "string"}, "zip": {"type": "string"}},
                "required": ["city", "zip"]},
    "tags": {"type": "array", "items": {"type": "string", "enum": ["red", "green", "blue"]}}},
    "required": ["name", "age", "address", "tags"]}
PERSON = {"name": "Ada Lovelace", "age": 36, "address": {"city": "London", "zip": "W1 2AB"},
          "tags": ["red", "blue", "green", "red"]}
# (label, constraint, a valid output), outputs written as the grammar's separators want.
CASES = [
    ("json_schema", GuidedDecodingParams(json_schema=PERSON_SCHEMA), json.dumps(PERSON)),
    ("json_object", GuidedDecodingParams(json_object=True), json.dumps({"k": [1, 2, {"x": "y"}], "z": None})),
    ("regex_email", GuidedDecodingParams(regex=r"[a-z.]{1,30}@[a-z]{1,20}\.(com|org)"),
     "ada.lovelace.analytical@engines.org"),
    ("choice", GuidedDecodingParams(choice=["positive", "negative", "neutral"]), "neutral"),
]
SCHEMA_FOR_THROUGHPUT = GuidedDecodingParams(json_schema={
    "type": "object", "properties": {"title": {"type": "string", "maxLength": 40},
                                     "year": {"type": "integer", "minimum": 1900, "maximum": 2030},
                                     "genres": {"type": "array", "maxItems": 3,
                                                "items": {"type": "string", "maxLength": 20}}},
    "required": ["title", "year", "genres"]})


@dataclass
class MaskTimings:
    label: str
    num_tokens: int
    compile_ms: float
    fill_us: list[float]
    apply_us: list[float]
    accept_us: list[float]
    # Every bitmask row the replay produced (for the batched apply timing).
    masks: list[torch.Tensor]


def timed(fn, *args):
    """(fn(*args), microseconds it took)."""
    started = time.perf_counter()
    result = fn(*args)
    return result, (time.perf_counter() - started) * 1e6


def replay(grammars: GrammarCache, tokenizer, label: str, guided, text: str) -> MaskTimings:
    """Time the fill, apply and accept of every token of `text` (then EOS) under `guided`."""
    compiled, compile_us = timed(grammars.compile, guided)
    timings = MaskTimings(label, 0, compile_us / 1e3, [], [], [], [])
    matcher = xgr.GrammarMatcher(compiled)
    logits = torch.randn(1, grammars.vocab_size)
    token_ids = tokenizer.encode(text, add_special_tokens=False) + [grammars.tokenizer_info.stop_token_ids[0]]
    for token_id in token_ids:
        (bitmask, _), fill_us = timed(fill_bitmask, [matcher], grammars.vocab_size)
        _, apply_us = timed(apply_token_bitmasks, logits, [bitmask[0]], [0])
        is_accepted, accept_us = timed(matcher.accept_token, token_id)
        if not is_accepted:
            raise RuntimeError(f"{label}: token {token_id} refused; the sample output is invalid")
        timings.fill_us.append(fill_us)
        timings.apply_us.append(apply_us)
        timings.accept_us.append(accept_us)
        timings.masks.append(bitmask[0])
    timings.num_tokens = len(token_ids)
    return timings


def batch_apply_us(masks: list[torch.Tensor], vocab_size: int, batch_size: int, num_constrained: int) -> float:
    """Mean µs to mask `num_constrained` of `batch_size` rows in one call, with the replays'
    real masks taken in turn."""
    logits = torch.randn(batch_size, vocab_size)
    indices = list(range(num_constrained))
    samples = []
    for first in range(0, len(masks), num_constrained):
        rows = [masks[(first + offset) % len(masks)] for offset in range(num_constrained)]
        samples.append(timed(apply_token_bitmasks, logits, rows, indices)[1])
    return statistics.mean(samples)


def print_mask_report(results: list[MaskTimings], vocab_size: int, batch_size: int) -> None:
    print(f"\n== mask cost per token (vocab {vocab_size}, one CPU row) ==")
    print(f"{'constraint':<12} {'tokens':>6} {'compile ms':>10} {'fill µs mean/p50/max':>22} "
          f"{'apply µs mean':>13} {'accept µs':>9}")
    for r in results:
        fill = f"{statistics.mean(r.fill_us):.1f}/{statistics.median(r.fill_us):.1f}/{max(r.fill_us):.0f}"
        print(f"{r.label:<12} {r.num_tokens:>6} {r.compile_ms:>10.2f} {fill:>22} "
              f"{statistics.mean(r.apply_us):>13.1f} {statistics.mean(r.accept_us):>9.1f}")
    masks = [mask for r in results for mask in r.masks]
    for num_constrained in (1, batch_size // 2, batch_size):
        total = batch_apply_us(masks, vocab_size, batch_size, num_constrained)
        print(f"apply, batch {batch_size} with {num_constrained} constrained rows: {total:.0f} µs per step "
              f"({total / num_constrained:.1f} µs per row)")


def run_mask_benchmark(tokenizer, vocab_size: int, stop_token_ids, batch_size: int) -> None:
    grammars = GrammarCache(tokenizer_info(tokenizer, vocab_size, stop_token_ids))
    results = [replay(grammars, tokenizer, label, guided, text) for label, guided, text in CASES]
    print_mask_report(results, vocab_size, batch_size)


@dataclass
class BatchRun:
    label: str
    wall_s: float
    num_output_tokens: int
    num_valid: int
    # Seconds spent in the engine's guided hooks: bitmask fill, apply (in the sampler), advance.
    hook_s: dict[str, float]

    @property
    def tokens_per_s(self) -> float:
        return self.num_output_tokens / self.wall_s

    def hook_us_per_token(self, hook: str) -> float:
        return self.hook_s[hook] / self.num_output_tokens * 1e6


class HookTimer:
    """Wraps the engine's guided hooks (and the sampler's bitmask apply) to total their time."""

    def __init__(self, engine):
        import shared.sampling.sampler as sampler_module
        self.totals = {"fill": 0.0, "apply": 0.0, "advance": 0.0}
        self._restore = [(engine.core.guided, "prepare_step"), (sampler_module, "apply_token_bitmasks"),
                         (engine.core.guided, "advance")]
        self._originals = [getattr(owner, name) for owner, name in self._restore]
        for (owner, name), original, hook in zip(self._restore, self._originals, self.totals):
            setattr(owner, name, self._timed(hook, original))

    def _timed(self, hook: str, fn):
        def wrapper(*args, **kwargs):
            started = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.totals[hook] += time.perf_counter() - started
        return wrapper

    def close(self) -> dict[str, float]:
        for (owner, name), original in zip(self._restore, self._originals):
            if owner.__class__.__name__ == "module":
                setattr(owner, name, original)
            else:
                delattr(owner, name)  # the instance attribute hid the class's method
        return self.totals


def timed_batch(llm, label: str, prompts, params, validate=None) -> BatchRun:
    timer = HookTimer(llm.engine)
    started = time.perf_counter()
    try:
        outputs = llm.generate(prompts, params)
    finally:
        wall_s = time.perf_counter() - started
        hook_s = timer.close()
    completions = [output.outputs[0] for output in outputs]
    num_valid = sum(1 for c in completions if validate is None or validate(c.text))
    return BatchRun(label, wall_s, sum(len(c.token_ids) for c in completions), num_valid, hook_s)


def is_json_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False


def run_throughput_benchmark(llm, batch_size: int, max_tokens: int) -> None:
    """Free vs constrained, same prompts and batch, greedy."""
    from shared.engine import SamplingParams
    from shared.tokenization.chat import apply_chat_template
    prompts = [apply_chat_template(llm.tokenizer, [{"role": "user", "content":
               f"Describe film number {index} as JSON with title, year and genres."}])
               for index in range(batch_size)]
    same_length = dict(temperature=0.0, max_tokens=max_tokens, min_tokens=max_tokens)
    words = GuidedDecodingParams(regex=r"[A-Za-z ,.]+")
    llm.generate(prompts[:2], SamplingParams(max_tokens=2))  # warm-up
    runs = [
        timed_batch(llm, "free (ignore_eos)", prompts, SamplingParams(**same_length, ignore_eos=True)),
        timed_batch(llm, "regex, same length", prompts, SamplingParams(**same_length, guided=words)),
        timed_batch(llm, "json schema", prompts, SamplingParams(temperature=0.0, max_tokens=max_tokens,
                                                                guided=SCHEMA_FOR_THROUGHPUT), is_json_object),
    ]
    print(f"\n== batch throughput (batch {batch_size}, up to {max_tokens} tokens, greedy) ==")
    print(f"{'run':<20} {'tokens':>7} {'wall s':>7} {'tok/s':>8} {'vs free':>8} {'valid':>6} "
          f"{'µs/token: fill':>15} {'apply':>6} {'advance':>8}")
    for run in runs:
        ratio = run.tokens_per_s / runs[0].tokens_per_s
        hooks = " ".join(f"{run.hook_us_per_token(hook):>{width}.1f}"
                         for hook, width in (("fill", 15), ("apply", 6), ("advance", 8)))
        print(f"{run.label:<20} {run.num_output_tokens:>7} {run.wall_s:>7.2f} {run.tokens_per_s:>8.1f} "
              f"{ratio:>7.2f}x {run.num_valid:>3}/{batch_size} {hooks}")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_engine_arguments(parser, "model", "dtype", "num_threads")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--mask-only", action="store_true", help="skip the model throughput part")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    from shared.engine import LLM
    if args.num_threads:
        torch.set_num_threads(args.num_threads)
    llm = LLM.from_engine_args(engine_args_from(args))
    engine = llm.engine
    from benchmarks.machine import print_machine

    print_machine(engine.core.executor.compute_paths)
    run_mask_benchmark(llm.tokenizer, engine.core.model_config.vocab_size, engine.core.model_config.eos_token_ids,
                       args.batch_size)
    if not args.mask_only:
        run_throughput_benchmark(llm, args.batch_size, args.max_tokens)


if __name__ == "__main__":
    main()
