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

from services.settings.engine_flags import add_engine_flags, engine_args_from


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    add_engine_flags(parser, ("model", "dtype", "num_threads", "kv_cache_memory_gb"), kv_cache_memory_gb=0.25)
    parser.add_argument("--prompt-tokens", type=int, default=256)
    parser.add_argument("--work", choices=("prefill", "decode"), default="prefill")
    parser.add_argument("--batch-size", type=int, default=4, help="sequences decoding at once (--work decode)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    from services.instance.engine_setup import build_engine_probe

    args = parse_args(argv)
    probe = build_engine_probe(engine_args_from(args), with_kv_transport=False)
    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    rng, vocab = random.Random(1), probe.info.vocab_size

    def prompt() -> list[int]:
        return [rng.randrange(3, vocab) for _ in range(args.prompt_tokens)]

    def announce() -> None:
        print("ready", flush=True)

    if args.work == "decode":
        probe.keep_decoding(prompt, args.batch_size, stop, announce)
    else:
        probe.keep_prefilling(prompt, stop, announce)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
