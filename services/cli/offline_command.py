"""`pdserve offline PROMPT... [options]`: generate with the in-process offline engine.

Runs `shared.engine.LLM` on the given prompts (raw completion, or chat with --chat) and
prints each completion on stdout; a throughput summary goes to stderr.
"""

import argparse
import sys
import time
from typing import Any

DTYPE_CHOICES = ("bfloat16", "float32")


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Called by services.cli.main.build_parser to register this subcommand."""
    parser = subparsers.add_parser("offline", help="generate text with the offline engine")
    parser.add_argument("prompts", nargs="+", metavar="PROMPT", help="one or more prompts")
    parser.add_argument("--model", help="HF folder or GGUF file (default: bundled SmolLM2-135M-Instruct)")
    parser.add_argument("--dtype", choices=DTYPE_CHOICES, default="bfloat16")
    add_device_arguments(parser)
    parser.add_argument("--max-tokens", type=int, default=64, help="new tokens per prompt (default: 64)")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 means greedy (default: 0)")
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=None, help="sampling seed")
    parser.add_argument("--chat", action="store_true", help="wrap each prompt as a user chat message")
    parser.add_argument("--speculative-method", choices=("none", "ngram", "draft"), default="none",
                        help="speculative decoding proposer (default: none)")
    parser.add_argument("--num-speculative-tokens", type=int, default=3, help="tokens proposed per step")
    parser.add_argument("--draft-model", default=None, help="draft HF folder (default: the target truncated)")
    parser.add_argument("--draft-num-layers", type=int, default=None, help="keep the draft's first N layers")
    parser.add_argument("--tensor-parallel-size", type=int, default=1, help="ranks sharing each layer")
    parser.add_argument("--pipeline-parallel-size", type=int, default=1, help="pipeline stages")
    parser.set_defaults(run=run)


def add_device_arguments(parser: argparse.ArgumentParser) -> None:
    """--device, --gpu-memory-utilization, --attention-backend (the engine's device settings)."""
    parser.add_argument("--device", default="auto",
                        help="auto (CUDA when available; env PDSERVE_DEVICE), cpu, cuda or cuda:N")
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.9,
                        help="on a GPU: share of its memory the engine may use (default 0.9)")
    parser.add_argument("--attention-backend", choices=("auto", "torch", "triton"), default="auto",
                        help="paged attention (default auto: triton on CUDA, torch on CPU)")


def device_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    return {"device": args.device, "gpu_memory_utilization": args.gpu_memory_utilization,
            "attention_backend": args.attention_backend}


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


def speculative_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """Engine keyword arguments for speculative decoding (none when it is off)."""
    if args.speculative_method == "none":
        return {}
    return {"speculative_method": args.speculative_method,
            "num_speculative_tokens": args.num_speculative_tokens,
            "draft_model": args.draft_model, "draft_num_layers": args.draft_num_layers}


def run(args: argparse.Namespace) -> int:
    """Loads the model, generates for every prompt, prints the completions."""
    from shared.model.default_model import resolve_model
    from shared.sampling.params import SamplingParams

    from services.common.engine_setup import build_offline_llm

    params = SamplingParams(**sampling_kwargs(args))
    llm = build_offline_llm(str(resolve_model(args.model)), args.dtype, **device_kwargs(args),
                            **speculative_kwargs(args), tensor_parallel_size=args.tensor_parallel_size,
                            pipeline_parallel_size=args.pipeline_parallel_size)
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
