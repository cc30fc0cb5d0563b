"""Multi-LoRA benchmark: output tokens/s with 1, 4 and 16 adapters mixed uniformly, against the
base model alone, offline and served, for pdserve and (with --vllm-python) vLLM's CPU backend.

Run by `make bench-lora` (`python -m benchmarks.lora [flags]`).

Rows of every table: "base" (a server or engine without LoRA), "lora, base requests" (LoRA
enabled, every request on the base model: what enabling LoRA costs requests that use none) and
"lora, N adapters" (request i on adapter i % N). Offline (benchmarks/lora_offline.py):
--batch-size chat prompts in one `generate`, --max-tokens each. Served
(benchmarks/lora_served.py): --num-requests random-token prompts of --prompt-len tokens,
--output-len each, --concurrency in flight, through pdserve's local stack (gateway + prefill +
decode) and `vllm serve`. Greedy, EOS ignored, so every run generates the same tokens.

The machine may be shared: the rows run interleaved (each of --rounds rounds runs every row
once), the tables show each row's median and its median ratio to the base run of the same
round, and the machine's load (`uptime`) is printed before and after. Adapters: random, rank
--rank on all seven projections (benchmarks/lora_workload.py).
"""

import argparse
import os
import platform
import subprocess
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from benchmarks.lora_offline import run_pdserve, run_vllm  # noqa: E402
from benchmarks.lora_served import random_prompts, run_served  # noqa: E402
from benchmarks.lora_workload import chat_prompts, format_rows, write_adapters  # noqa: E402
from benchmarks.serve_servers import ServerOptions  # noqa: E402
from shared.model.config import ModelConfig  # noqa: E402
from shared.model.cpu_budget import default_num_threads  # noqa: E402
from shared.model.default_model import resolve_model  # noqa: E402
from shared.tokenization.chat import apply_chat_template  # noqa: E402
from shared.tokenization.tokenizer import load_tokenizer  # noqa: E402
from benchmarks.engine_flags import add_engine_arguments  # noqa: E402

KV_CACHE_GB = 0.25  # per pdserve instance
VLLM_MEMORY_UTILIZATION = 0.1  # vLLM's share of RAM (weights and KV) per server on its CPU backend
PARTS = ("offline", "served", "vllm-offline", "vllm-served")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=None,
                        help="what to run (default: offline and served, plus vLLM's with --vllm-python)")
    add_engine_arguments(parser, "model", "dtype", "num_threads")
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--adapters", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (every row once each)")
    parser.add_argument("--batch-size", type=int, default=32, help="offline: prompts in one generate")
    parser.add_argument("--max-tokens", type=int, default=64, help="offline: output tokens each")
    parser.add_argument("--num-requests", type=int, default=32, help="served: requests per row and round")
    parser.add_argument("--concurrency", type=int, default=16, help="served: requests in flight at most")
    parser.add_argument("--prompt-len", type=int, default=64, help="served: prompt tokens each")
    parser.add_argument("--output-len", type=int, default=64, help="served: output tokens each")
    parser.add_argument("--vllm-python", type=Path, default=os.environ.get("PDSERVE_VLLM_PYTHON") or None,
                        help="python of vLLM's own virtualenv (env PDSERVE_VLLM_PYTHON)")
    parser.add_argument("--run-dir", type=Path, default=None, help="served: logs here (default: a temporary folder)")
    return parser


def machine_line() -> str:
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    model = next((line.split(":", 1)[1].strip() for line in flags.splitlines() if line.startswith("model name")),
                 platform.processor())
    bf16 = [flag for flag in ("amx_bf16", "avx512_bf16") if f" {flag}" in flags]
    return f"{model}, {os.cpu_count()} CPUs, bf16 flags: {' '.join(bf16) or 'none'}"


def load_line() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    parts = args.parts or ["offline", "served"] + (["vllm-offline", "vllm-served"] if args.vllm_python else [])
    if any(part.startswith("vllm") for part in parts) and args.vllm_python is None:
        raise SystemExit("--vllm-python (or PDSERVE_VLLM_PYTHON) is needed for the vllm parts")
    folder = resolve_model(args.model)
    config = ModelConfig.from_folder(folder)
    print(f"{folder.name}, {args.dtype}, rank {args.rank} on all seven projections; {machine_line()}")
    print(f"load before: {load_line()}", flush=True)
    conversations = chat_prompts(args.batch_size)
    offline_title = f"offline: batch {args.batch_size}, {args.max_tokens} tokens each, {args.rounds} rounds"
    served_title = (f"served: {args.num_requests} requests of {args.prompt_len} prompt tokens, {args.output_len} "
                    f"output tokens, {args.concurrency} in flight, {args.rounds} rounds")
    prompts = random_prompts(args.num_requests, args.prompt_len, config.vocab_size, seed=0)
    with tempfile.TemporaryDirectory(prefix="pdserve-bench-lora-") as root:
        adapters = write_adapters(Path(root) / "adapters", config, max(args.adapters), args.rank)
        run_dir = args.run_dir or Path(root) / "runs"
        # Two servers run side by side: each gets a small KV pool (plenty for these requests).
        options = ServerOptions(model=args.model, dtype=args.dtype, vllm_python=args.vllm_python,
                                vllm_memory_utilization=VLLM_MEMORY_UTILIZATION, vllm_args=("--max-model-len", "2048"),
                                env={"PDSERVE_KV_CACHE_MEMORY_GB": str(KV_CACHE_GB)})
        for part in parts:
            if part == "offline":
                rates = run_pdserve(folder, args.dtype, args.num_threads, conversations, args.max_tokens, adapters,
                                    args.adapters, args.rank, args.rounds)
                threads = args.num_threads or default_num_threads()
                print(format_rows(f"pdserve {offline_title}, {threads} torch threads", rates))
            elif part == "vllm-offline":
                tokenizer = load_tokenizer(folder)
                texts = [apply_chat_template(tokenizer, conversation) for conversation in conversations]
                rates = run_vllm(args.vllm_python, folder, args.dtype, texts, args.max_tokens, adapters,
                                 args.adapters, args.rank, args.rounds)
                print(format_rows(f"vLLM {offline_title}", rates))
            else:
                server = "vllm" if part == "vllm-served" else "pdserve"
                rates = run_served(server, options, run_dir, adapters, args.adapters, args.rank, prompts,
                                   args.output_len, args.concurrency, args.rounds)
                print(format_rows(f"{server} {served_title}", rates))
            print(f"load after {part}: {load_line()}", flush=True)


if __name__ == "__main__":
    main()
