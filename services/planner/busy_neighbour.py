"""A busy neighbour for `pdserve profile`'s co-location measurement: a second engine, built
like the profiled one, working until its stdin closes: prefilling random prompts back to back
(`--work prefill`), or decoding a batch of `--batch-size` sequences step after step
(`--work decode`), the two loads a P/D host pairs.

    python -m services.planner.busy_neighbour --dtype bfloat16 --num-threads 1 [--work decode]

It prints "ready" once it is at work, so the profiler measures only while it works.
"""

import argparse
import random
import sys
import threading

from services.common.engine_flags import add_engine_flags, engine_args_from


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    add_engine_flags(parser, ("model", "dtype", "num_threads", "kv_cache_memory_gb"), kv_cache_memory_gb=0.25)
    parser.add_argument("--prompt-tokens", type=int, default=256)
    parser.add_argument("--work", choices=("prefill", "decode"), default="prefill")
    parser.add_argument("--batch-size", type=int, default=4, help="sequences decoding at once (--work decode)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    from shared.engine.llm_engine import LLMEngine

    args = parse_args(argv)
    engine = LLMEngine.from_config(engine_args_from(args).create_engine_config())
    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    rng, vocab = random.Random(1), engine.model_config.vocab_size

    def prompt() -> list[int]:
        return [rng.randrange(3, vocab) for _ in range(args.prompt_tokens)]

    if args.work == "decode":
        decode_until(stop, engine, prompt, args.batch_size)
    else:
        prefill_until(stop, engine, prompt)
    return 0


def prefill_until(stop: threading.Event, engine, prompt) -> None:
    from shared.sampling.params import SamplingParams
    params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    announced = False
    while not stop.is_set():
        engine.add_request(prompt(), params)
        while engine.has_unfinished_requests():
            engine.step()
        if not announced:
            print("ready", flush=True)
            announced = True


def decode_until(stop: threading.Event, engine, prompt, batch_size: int) -> None:
    """Keep `batch_size` sequences decoding (a finished one is replaced by a new prompt); at
    work once every sequence has produced a token."""
    from shared.sampling.params import SamplingParams
    params = SamplingParams(temperature=0.0, max_tokens=256, ignore_eos=True)
    in_flight, producing = set(), set()
    announced = False
    while not stop.is_set():
        while len(in_flight) < batch_size:
            in_flight.add(engine.add_request(prompt(), params))
        for output in engine.step():
            producing.add(output.request_id)
            if output.finished:
                in_flight.discard(output.request_id)
                producing.discard(output.request_id)
        if not announced and in_flight <= producing:
            print("ready", flush=True)
            announced = True


if __name__ == "__main__":
    raise SystemExit(main())
