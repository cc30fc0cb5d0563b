"""Greedy parity on the GPU: pdserve's engine (Triton attention) against transformers, same model,
same device, same dtype, token for token.

In float32 the outputs should be identical. In bfloat16 two implementations round differently,
so a near-tie between the top two tokens may flip and the continuations part: the report gives
the common prefix of each prompt's tokens.

    python -m benchmarks.gpu_parity [--model FOLDER] [--dtype bfloat16] [--json out.json]
"""

import argparse
import json
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from benchmarks.engine_flags import add_engine_arguments  # noqa: E402

PROMPTS = [
    "The sky is blue because",
    "Write a haiku about the sea.",
    "List three prime numbers:",
    "In 1969, astronauts",
]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_engine_arguments(parser, "model", "dtype")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--json", type=Path)
    return parser.parse_args(argv)


def pdserve_tokens(model_dir: Path, prompt_ids: list[list[int]], args: argparse.Namespace) -> list[list[int]]:
    from shared.engine import LLM, SamplingParams

    llm = LLM(model=str(model_dir), dtype=args.dtype, device="cuda", gpu_memory_utilization=0.3)
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
    return [list(output.token_ids) for output in llm.generate(prompt_ids, params)]


def transformers_tokens(model_dir: Path, prompt_ids: list[list[int]], args: argparse.Namespace) -> list[list[int]]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, args.dtype)).to("cuda").eval()
    results = []
    for ids in prompt_ids:
        generated = model.generate(torch.tensor([ids], device="cuda"), max_new_tokens=args.max_tokens,
                                   min_new_tokens=args.max_tokens, do_sample=False)
        results.append(generated[0, len(ids):].tolist())
    return results


def common_prefix(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def compare(ours: list[list[int]], theirs: list[list[int]]) -> dict:
    prefixes = [common_prefix(a, b) for a, b in zip(ours, theirs)]
    return {"num_identical": sum(a == b for a, b in zip(ours, theirs)), "num_prompts": len(ours),
            "common_prefix_tokens": prefixes}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("gpu parity: no GPU")
        return 2
    from transformers import AutoTokenizer

    from shared.model.default_model import resolve_model

    model_dir = resolve_model(args.model)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    prompt_ids = [tokenizer.encode(prompt) for prompt in PROMPTS]
    result = {"dtype": args.dtype, "max_tokens": args.max_tokens} | compare(
        pdserve_tokens(model_dir, prompt_ids, args), transformers_tokens(model_dir, prompt_ids, args))
    print(f"greedy parity ({args.dtype}): {result['num_identical']}/{result['num_prompts']} identical, "
          f"common prefixes {result['common_prefix_tokens']} of {args.max_tokens}")
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2))
    return 0 if args.dtype != "float32" or result["num_identical"] == result["num_prompts"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
