"""`pdserve offline PROMPT... [options]`: generate with the in-process offline engine.

Runs `shared.engine.LLM` on the given prompts (raw completion, or chat with --chat) and
prints each completion on stdout; a throughput summary goes to stderr.
"""

import argparse
import sys
import time
from typing import Any

from services.settings.engine_flags import add_engine_flags, engine_args_from

# The engine's settings this command takes (EngineArgs fields, named as an instance's flags).
OFFLINE_ENGINE_FLAGS = ("model", "dtype", "device", "gpu_memory_utilization", "attention_backend",
                        "speculative_method", "num_speculative_tokens", "draft_model", "draft_num_layers",
                        "tensor_parallel_size", "pipeline_parallel_size")
# Checked when the flags are parsed (as they were before the flags came from EngineArgs).
OFFLINE_CHOICES = {"dtype": ("bfloat16", "float32"), "attention_backend": ("auto", "torch", "triton"),
                   "speculative_method": ("none", "ngram", "draft")}


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Called by services.cli.main.build_parser to register this subcommand."""
    parser = subparsers.add_parser("offline", help="generate text with the offline engine")
    parser.add_argument("prompts", nargs="+", metavar="PROMPT", help="one or more prompts")
    add_engine_flags(parser, OFFLINE_ENGINE_FLAGS, choices=OFFLINE_CHOICES)
    parser.add_argument("--max-tokens", type=int, default=64, help="new tokens per prompt (default: 64)")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 means greedy (default: 0)")
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=None, help="sampling seed")
    parser.add_argument("--chat", action="store_true", help="wrap each prompt as a user chat message")
    parser.set_defaults(run=run)


def sampling_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """SamplingParams keyword arguments from the parsed flags (seed only when given)."""
    kwargs: dict[str, Any] = {
        "max_tokens": args.max_tokens,
        "temperature": args.temperature,
        "top_p": args.top_p,
    }
    if args.seed is not None:
        kwargs["seed"] = args.seed
    return kwargs


def run(args: argparse.Namespace) -> int:
    """Loads the model, generates for every prompt, prints the completions."""
    from shared.model.default_model import resolve_model
    from shared.sampling.params import SamplingParams

    from services.instance.engine_setup import build_offline_llm

    params = SamplingParams(**sampling_kwargs(args))
    llm = build_offline_llm(engine_args_from(args, model=str(resolve_model(args.model or None))))
    started = time.perf_counter()
    if args.chat:
        conversations = [[{"role": "user", "content": prompt}] for prompt in args.prompts]
        outputs = llm.chat(conversations, params)
    else:
        outputs = llm.generate(list(args.prompts), params)
    elapsed_s = time.perf_counter() - started
    print_outputs(args.prompts, outputs)
    num_tokens = sum(len(completion_of(output).token_ids) for output in outputs)
    print(f"[{num_tokens} tokens in {elapsed_s:.2f} s, {num_tokens / elapsed_s:.1f} tok/s]", file=sys.stderr)
    llm.shutdown()
    return 0


def print_outputs(prompts: list[str], outputs: list[Any]) -> None:
    """One block per prompt: the prompt, then its completion."""
    for index, (prompt, output) in enumerate(zip(prompts, outputs)):
        if len(prompts) > 1:
            print(f"=== [{index}] {prompt}")
        print(completion_of(output).text)


def completion_of(output: Any) -> Any:
    """The completion (`.text`, `.token_ids`) in one per-prompt result of LLM.generate/chat.

    Accepts either a completion itself or a RequestOutput that wraps it in `.outputs`.
    """
    return output.outputs[0] if hasattr(output, "outputs") else output
