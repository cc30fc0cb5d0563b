"""A busy neighbour for `pdserve profile`'s co-location measurement: a second engine, built
like the profiled one, prefilling random prompts back to back until its stdin closes.

    python -m services.planner.busy_neighbour --dtype bfloat16 --num-threads 1 [--model M]

It prints "ready" once its first prompt is done, so the profiler measures only while it works.
"""

import argparse
import random
import sys
import threading

def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default=None)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--num-threads", type=int, default=None)
    parser.add_argument("--kv-cache-memory-bytes", type=int, default=1 << 28)
    parser.add_argument("--prompt-tokens", type=int, default=256)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    from shared.engine.llm import engine_config_from_kwargs
    from shared.engine.llm_engine import LLMEngine
    from shared.sampling.params import SamplingParams

    args = parse_args(argv)
    config = engine_config_from_kwargs(args.model, args.dtype, num_threads=args.num_threads,
                                       kv_cache_memory_bytes=args.kv_cache_memory_bytes)
    engine = LLMEngine.from_config(config)
    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    rng, vocab = random.Random(1), engine.model_config.vocab_size
    params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    announced = False
    while not stop.is_set():
        engine.add_request([rng.randrange(3, vocab) for _ in range(args.prompt_tokens)], params)
        while engine.has_unfinished_requests():
            engine.step()
        if not announced:
            print("ready", flush=True)
            announced = True
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
