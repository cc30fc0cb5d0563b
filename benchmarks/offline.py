"""Offline throughput benchmark: pdserve's LLM vs transformers' generate, same token ids.

Run by `make bench-offline` (`python -m benchmarks.offline [flags]`). Builds a fixed set of
prompts from common English words (random lengths in [128, 256] tokens, fixed seed), runs
pdserve's offline engine on all of them at once, then transformers' `generate` in left-padded
batches of 16, greedy with EOS ignored, and prints throughput, KV memory and output agreement.
`--beside-hog` and `--compare-deterministic` run pdserve alone in other ways
(benchmarks/offline_contention.py). Threads: `--num-threads`, default the CPUs this process
may use (affinity mask and cgroup quota); OpenMP threads spin only briefly before sleeping
unless OMP_WAIT_POLICY or GOMP_SPINCOUNT is set (shared/model/cpu_budget.py).
"""

import argparse
import json
import os
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from shared.model.cpu_budget import cpu_budget, prefer_bounded_spinning  # noqa: E402

prefer_bounded_spinning()  # before torch loads the OpenMP runtime

import torch  # noqa: E402

from benchmarks.machine import print_machine  # noqa: E402
from benchmarks.engine_flags import add_engine_arguments, engine_args_from  # noqa: E402

COMMON_WORDS = (
    "the people time year way day man thing woman life child world school state family student "
    "group country problem hand part place case week company system program question work "
    "government number night point home water room mother area money story fact month lot right "
    "study book eye job word business issue side kind head house service friend father power hour "
    "game line end member law car city community name president team minute idea kid body "
    "information back parent face others level office door health person art war history party "
    "result change morning reason research girl guy moment air teacher force education good new "
    "first last long great little own other old big high different small large next early young "
    "important few public bad same able make know take see come think look want give use find "
    "tell ask seem feel try leave call keep let begin show hear play run move live believe bring "
    "happen write sit stand lose pay meet include continue learn lead understand watch follow stop "
    "create speak read spend grow open walk win teach offer remember love consider appear buy wait "
    "serve die send build stay fall cut reach kill remain river mountain garden window light music"
).split()

MIN_PROMPT_LEN = 128
MAX_PROMPT_LEN = 256
BASELINE_BATCH_SIZE = 16
MIB = 1024 * 1024


@dataclass
class RunResult:
    """Timing of one engine over the whole prompt set."""

    name: str
    wall_s: float
    num_prompt_tokens: int
    num_output_tokens: int

    @property
    def output_tokens_per_s(self) -> float:
        return self.num_output_tokens / self.wall_s

    @property
    def total_tokens_per_s(self) -> float:
        return (self.num_prompt_tokens + self.num_output_tokens) / self.wall_s


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-prompts", type=int, default=64)
    parser.add_argument("--output-len", type=int, default=128, help="new tokens per prompt")
    parser.add_argument("--skip-baseline", action="store_true", help="do not run transformers")
    add_engine_arguments(parser, "dtype", "device", "model", "num_threads", device="cpu")
    parser.add_argument("--seed", type=int, default=0, help="seed for prompt lengths and words")
    parser.add_argument("--json", type=Path, help="also write the results to this JSON file")
    parser.add_argument("--deterministic", action="store_true", help="pdserve in deterministic mode")
    parser.add_argument("--vllm-python", type=Path, default=os.environ.get("PDSERVE_VLLM_PYTHON") or None,
                        help="also run vLLM's offline engine with this interpreter (its own virtualenv; "
                             "env PDSERVE_VLLM_PYTHON)")
    parser.add_argument("--vllm-dtype", choices=("bfloat16", "float32"), default=None,
                        help="vLLM's dtype (default: --dtype); float32 may be vLLM's faster choice on a CPU without "
                             "bf16 hardware. vLLM reserves one CPU for its front end unless "
                             "VLLM_CPU_NUM_OF_RESERVED_CPU=0 is set")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--beside-hog", action="store_true",
                      help="instead: pdserve quiet, then beside `yes > /dev/null` on one CPU; prints the ratio")
    mode.add_argument("--compare-deterministic", action="store_true",
                      help="instead: pdserve default vs deterministic=True; prints the cost")
    parser.add_argument("--parallel", nargs="?", const="1x1,1x1:2,3x1,1x2", default=None, metavar="LAYOUTS",
                        help="instead: rows per tensor x pipeline layout, "
                             "TxP[:threads per rank] (default 1x1,1x1:2,3x1,1x2)")
    return parser.parse_args()


def build_prompt_ids(tokenizer: Any, num_prompts: int, seed: int) -> list[list[int]]:
    """Token id lists of common English words, each of a length drawn in [128, 256]."""
    rng = random.Random(seed)
    prompts = []
    for _ in range(num_prompts):
        target_len = rng.randint(MIN_PROMPT_LEN, MAX_PROMPT_LEN)
        token_ids: list[int] = []
        while len(token_ids) < target_len:
            words = " ".join(rng.choice(COMMON_WORDS) for _ in range(target_len))
            token_ids += tokenizer.encode(" " + words, add_special_tokens=False)
        prompts.append(token_ids[:target_len])
    return prompts


def run_pdserve(model_dir: Path, prompt_ids: list[list[int]], args: argparse.Namespace,
                deterministic: bool | None = None) -> tuple:
    """Times LLM.generate on all prompts at once (after a 2-prompt warm-up) on a new engine
    (`deterministic` defaults to --deterministic).

    Returns (RunResult, per-prompt output token ids, the LLM for its KV usage).
    """
    from shared.engine import LLM, SamplingParams

    deterministic = args.deterministic if deterministic is None else deterministic
    llm = LLM.from_engine_args(engine_args_from(args, model=str(model_dir), num_threads=torch.get_num_threads(),
                                                deterministic=deterministic))
    params = SamplingParams(temperature=0, max_tokens=args.output_len, ignore_eos=True)
    warmup_params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    llm.generate([ids[:16] for ids in prompt_ids[:2]], warmup_params)
    _synchronize(args.device)
    started = time.perf_counter()
    outputs = llm.generate(prompt_ids, params)
    _synchronize(args.device)
    wall_s = time.perf_counter() - started
    # One result per prompt: a completion, or a RequestOutput wrapping it in `.outputs`.
    completions = [output.outputs[0] if hasattr(output, "outputs") else output for output in outputs]
    output_ids = [list(completion.token_ids) for completion in completions]
    result = RunResult("pdserve", wall_s, sum(map(len, prompt_ids)), sum(map(len, output_ids)))
    return result, output_ids, llm


def run_vllm(model_dir: Path, prompt_ids: list[list[int]], args: argparse.Namespace) -> tuple:
    """Times vLLM on the same ids in a child process (benchmarks/vllm_peer.py). Returns
    (RunResult, output ids, what vLLM says of its compute paths)."""
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory(prefix="pdserve-vllm-") as folder:
        request, result = Path(folder) / "request.json", Path(folder) / "result.json"
        request.write_text(json.dumps({"model": str(model_dir), "dtype": args.vllm_dtype or args.dtype,
                                       "output_len": args.output_len,
                                       "prompt_ids": prompt_ids}))
        script = Path(__file__).with_name("vllm_peer.py")
        subprocess.run([str(args.vllm_python), str(script), str(request), str(result)], check=True)
        figures = json.loads(result.read_text())
    name = "vllm" if not args.vllm_dtype or args.vllm_dtype == args.dtype else f"vllm ({args.vllm_dtype})"
    run = RunResult(name, figures["wall_s"], figures["num_prompt_tokens"], figures["num_output_tokens"])
    return run, figures["output_ids"], figures.get("paths", "unknown")


def _synchronize(device: str) -> None:
    if device != "cpu" and torch.cuda.is_available():
        torch.cuda.synchronize()


def left_padded_batch(batch_ids: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask) with every row left-padded to the batch's longest prompt."""
    width = max(map(len, batch_ids))
    input_ids = torch.full((len(batch_ids), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(batch_ids), width), dtype=torch.long)
    for row, ids in enumerate(batch_ids):
        input_ids[row, width - len(ids):] = torch.tensor(ids)
        attention_mask[row, width - len(ids):] = 1
    return input_ids, attention_mask


def hf_generate(model: Any, batch_ids: list[list[int]], pad_id: int, output_len: int) -> list[list[int]]:
    """Greedy transformers generate of exactly `output_len` new tokens per prompt."""
    input_ids, attention_mask = left_padded_batch(batch_ids, pad_id)
    generated = model.generate(
        input_ids.to(model.device),
        attention_mask=attention_mask.to(model.device),
        max_new_tokens=output_len,
        min_new_tokens=output_len,
        do_sample=False,
        pad_token_id=pad_id,
    )
    return generated[:, input_ids.shape[1]:].tolist()


def run_transformers(model_dir: Path, prompt_ids: list[list[int]], args: argparse.Namespace) -> tuple:
    """Times transformers on the same ids in batches of 16. Returns (RunResult, output ids)."""
    from transformers import AutoModelForCausalLM

    dtype = getattr(torch, args.dtype)
    from shared.engine.device import resolve_device

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(resolve_device(args.device)).eval()
    pad_id = model.generation_config.eos_token_id
    pad_id = pad_id[0] if isinstance(pad_id, list) else pad_id
    hf_generate(model, [ids[:16] for ids in prompt_ids[:2]], pad_id, 8)
    output_ids: list[list[int]] = []
    started = time.perf_counter()
    for start in range(0, len(prompt_ids), BASELINE_BATCH_SIZE):
        batch = prompt_ids[start:start + BASELINE_BATCH_SIZE]
        output_ids += hf_generate(model, batch, pad_id, args.output_len)
    wall_s = time.perf_counter() - started
    result = RunResult("transformers", wall_s, sum(map(len, prompt_ids)), sum(map(len, output_ids)))
    return result, output_ids


def agreement(ours: list[list[int]], theirs: list[list[int]]) -> dict[str, float]:
    """How many outputs match token for token, and the mean length of the common prefix."""
    prefix_lens = []
    for a, b in zip(ours, theirs):
        common = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        prefix_lens.append(common)
    num_identical = sum(a == b for a, b in zip(ours, theirs))
    return {"num_identical": num_identical, "num_compared": len(prefix_lens),
            "mean_common_prefix_tokens": sum(prefix_lens) / max(1, len(prefix_lens))}


def kv_memory_report(llm: Any, args: argparse.Namespace) -> dict[str, float]:
    """Paged KV use at peak vs static max-length allocations, in MiB."""
    usage = llm.kv_usage()
    max_model_len = llm.engine.core.max_model_len
    per_token = usage.bytes_per_token
    slots_at_peak = usage.peak_num_blocks_used * usage.block_size
    max_request_len = MAX_PROMPT_LEN + args.output_len
    return {
        "block_size": usage.block_size,
        "num_blocks_total": usage.num_blocks_total,
        "bytes_per_token": per_token,
        "peak_tokens_held": usage.peak_num_tokens_held,
        "peak_slots_allocated": slots_at_peak,
        "peak_tokens_held_mib": usage.peak_num_tokens_held * per_token / MIB,
        "peak_slots_allocated_mib": slots_at_peak * per_token / MIB,
        "max_model_len": max_model_len,
        "static_max_model_len_mib": args.num_prompts * max_model_len * per_token / MIB,
        "static_max_request_len": max_request_len,
        "static_max_request_len_mib": args.num_prompts * max_request_len * per_token / MIB,
    }


def print_throughput(results: list[RunResult]) -> None:
    print(f"{'engine':<14}{'wall s':>10}{'output tok/s':>15}{'total tok/s':>14}")
    for result in results:
        print(f"{result.name:<14}{result.wall_s:>10.2f}{result.output_tokens_per_s:>15.1f}"
              f"{result.total_tokens_per_s:>14.1f}")
    if len(results) == 2:
        ours, theirs = results
        label = "pdserve/hf" if theirs.name == "transformers" else f"pdserve/{theirs.name}"
        print(f"{label:<14}{theirs.wall_s / ours.wall_s:>9.2f}x"
              f"{ours.output_tokens_per_s / theirs.output_tokens_per_s:>14.2f}x"
              f"{ours.total_tokens_per_s / theirs.total_tokens_per_s:>13.2f}x")


def print_kv_memory(kv: dict[str, float], num_prompts: int) -> None:
    print(f"\nKV cache ({kv['bytes_per_token']} bytes/token, block size {kv['block_size']}, "
          f"{kv['num_blocks_total']} blocks):")
    print(f"  peak tokens held          {kv['peak_tokens_held']:>9} tokens {kv['peak_tokens_held_mib']:>9.1f} MiB")
    print(f"  peak KV slots allocated   {kv['peak_slots_allocated']:>9} slots  "
          f"{kv['peak_slots_allocated_mib']:>9.1f} MiB")
    print(f"  static {num_prompts} x max_model_len ({kv['max_model_len']})".ljust(44)
          + f"{kv['static_max_model_len_mib']:>9.1f} MiB")
    print(f"  static {num_prompts} x max request ({kv['static_max_request_len']})".ljust(44)
          + f"{kv['static_max_request_len_mib']:>9.1f} MiB")


def load_workload(args: argparse.Namespace) -> tuple[Path, list[list[int]]]:
    """Set the thread count (--num-threads, else the CPUs this process may use) and return the
    model folder and the benchmark's prompts (--model, --num-prompts, --seed), printing what they
    are; `benchmarks.step_overhead` runs the same workload."""
    torch.set_num_threads(args.num_threads or cpu_budget())
    from transformers import AutoTokenizer

    from shared.model.default_model import resolve_model

    model_dir = resolve_model(args.model)
    prompt_ids = build_prompt_ids(AutoTokenizer.from_pretrained(model_dir), args.num_prompts, args.seed)
    print(f"{args.num_prompts} prompts, {sum(map(len, prompt_ids))} prompt tokens, "
          f"{args.output_len} output tokens each, dtype {args.dtype}, {torch.get_num_threads()} threads")
    return model_dir, prompt_ids


def main() -> None:
    args = parse_args()
    model_dir, prompt_ids = load_workload(args)
    if args.parallel is not None:
        from benchmarks.parallel_rows import parse_layouts, run_parallel_rows
        rows = run_parallel_rows(model_dir, prompt_ids, args.dtype, args.output_len, parse_layouts(args.parallel))
        if args.json is not None:
            args.json.write_text(json.dumps({"args": vars(args) | {"json": str(args.json)}, "parallel": rows}, indent=2))
        return
    if args.beside_hog or args.compare_deterministic:
        from benchmarks.offline_contention import run_beside_hog, run_deterministic_comparison
        mode = run_beside_hog if args.beside_hog else run_deterministic_comparison
        figures = mode(run_pdserve, model_dir, prompt_ids, args)
        if args.json is not None:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps({"args": vars(args) | {"json": str(args.json)}, **figures}, indent=2))
        return
    ours, our_ids, llm = run_pdserve(model_dir, prompt_ids, args)
    results = [ours]
    report: dict[str, Any] = {"args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}}
    report["machine"] = print_machine(llm.engine.core.executor.compute_paths)
    if not args.skip_baseline:
        theirs, their_ids = run_transformers(model_dir, prompt_ids, args)
        results.append(theirs)
        report["agreement"] = agreement(our_ids, their_ids)
    if args.vllm_python is not None:
        peer, peer_ids, peer_paths = run_vllm(model_dir, prompt_ids, args)
        report["vllm_agreement"] = agreement(our_ids, peer_ids)
        report["vllm_paths"] = peer_paths
        print(f"vLLM: {peer_paths}")
        print_throughput([ours, peer])
        print()
    print_throughput(results)
    report["runs"] = [asdict(r) | {"output_tokens_per_s": r.output_tokens_per_s,
                                   "total_tokens_per_s": r.total_tokens_per_s} for r in results]
    report["kv_memory"] = kv_memory_report(llm, args)
    print_kv_memory(report["kv_memory"], args.num_prompts)
    if "agreement" in report:
        match = report["agreement"]
        print(f"\ngreedy outputs identical to transformers: {match['num_identical']}/{match['num_compared']} "
              f"(mean common prefix {match['mean_common_prefix_tokens']:.1f} tokens)")
    if "vllm_agreement" in report:
        match = report["vllm_agreement"]
        print(f"greedy outputs identical to vLLM: {match['num_identical']}/{match['num_compared']} "
              f"(mean common prefix {match['mean_common_prefix_tokens']:.1f} tokens)")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
