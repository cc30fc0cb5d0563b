"""Head-of-line blocking: a short request's time to first token while a max-length prompt is
being prefilled, with fair prefill (the default) and with first-come-takes-all.

Run by `make bench-hol` (`python -m benchmarks.head_of_line [flags]`). For each mode, one
engine (the default model unless --model) gets a long prompt, computes its first chunk, then
gets a one-token prompt; the short request's time to first token is measured from its arrival,
with the number of engine steps it waited. Timings are wall-clock and noisy on a shared
machine; compare the two modes within one run.
"""

import argparse
import os
import time
from dataclasses import dataclass

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from shared.engine import LLM, SamplingParams  # noqa: E402
from benchmarks.engine_flags import add_engine_arguments, engine_args_from  # noqa: E402

LONG_TOKEN_ID = 1000
SHORT_PROMPT = [2000, 2001, 2002]


@dataclass
class Measurement:
    fair_prefill: bool
    short_ttft_s: float
    short_steps_waited: int
    long_ttft_s: float


def measure(args: argparse.Namespace, fair_prefill: bool) -> Measurement:
    llm = LLM.from_engine_args(engine_args_from(args, max_num_batched_tokens=args.max_num_batched_tokens,
                                                fair_prefill=fair_prefill, enable_prefix_caching=False))
    engine = llm.engine
    long_prompt = [LONG_TOKEN_ID + i % 500 for i in range(min(args.prompt_tokens, engine.core.max_model_len - 1))]
    started = time.perf_counter()
    engine.add_request(long_prompt, SamplingParams(max_tokens=1, temperature=0), request_id="long")
    engine.step()  # the long prompt's first chunk: it is now part-way through
    arrived = time.perf_counter()
    engine.add_request(SHORT_PROMPT, SamplingParams(max_tokens=1, temperature=0), request_id="short")
    first_token = {}
    steps = 0
    while len(first_token) < 2:
        outputs = engine.step()
        steps += "short" not in first_token
        for output in outputs:
            if output.token_ids and output.request_id not in first_token:
                first_token[output.request_id] = time.perf_counter()
    return Measurement(fair_prefill, first_token["short"] - arrived, steps, first_token["long"] - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_engine_arguments(parser, "model", "dtype", "num_threads")
    parser.add_argument("--prompt-tokens", type=int, default=8191, help="length of the long prompt")
    parser.add_argument("--max-num-batched-tokens", type=int, default=2048)
    args = parser.parse_args()
    from benchmarks.machine import default_model_paths, print_machine

    print_machine(default_model_paths(args.dtype))
    results = []
    for fair_prefill in (False, True):
        results.append(measure(args, fair_prefill))
        print(f"measured: {results[-1]}", flush=True)
    print(f"long prompt {args.prompt_tokens} tokens, budget {args.max_num_batched_tokens} tokens per step")
    print(f"{'mode':<24}{'short TTFT (s)':>16}{'steps waited':>14}{'long TTFT (s)':>15}")
    for result in results:
        mode = "fair prefill" if result.fair_prefill else "first come takes all"
        print(f"{mode:<24}{result.short_ttft_s:>16.2f}{result.short_steps_waited:>14}{result.long_ttft_s:>15.2f}")
    before, after = results
    print(f"short TTFT ratio (first come / fair): {before.short_ttft_s / after.short_ttft_s:.1f}x")


if __name__ == "__main__":
    main()
