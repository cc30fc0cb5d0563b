"""vLLM's offline engine on the multi-LoRA benchmark's rows, run in vLLM's own virtualenv.

`python -m benchmarks.lora --vllm-python VENV/bin/python` writes the request and runs this
script with that interpreter; it must import nothing from pdserve. Usage:
`VENV/bin/python benchmarks/lora_vllm_peer.py REQUEST.json RESULT.json`. The request holds
{"model", "dtype", "prompts" (texts), "max_tokens", "rank", "rounds", "rows": [[label, adapter
count], ...], "adapters": [[name, int id, path], ...]}; the result maps "base" and each row's
label to its output tok/s, one figure per round. Like pdserve's part: an engine without LoRA
and one with enable_lora (max_loras = the largest count) side by side, rows interleaved; both
eager (no torch.compile) unless the request says "enforce_eager": false.
"""

import json
import sys
import time

MEMORY_UTILIZATION = 0.1  # of RAM, per engine (weights, activations and KV)


def rate(llm, prompts, params, requests) -> float:
    started = time.perf_counter()
    outputs = llm.generate(prompts, params, lora_request=requests, use_tqdm=False)
    elapsed = time.perf_counter() - started
    return sum(len(output.outputs[0].token_ids) for output in outputs) / elapsed


def main(request_path: str, result_path: str) -> None:
    from vllm import LLM, SamplingParams
    from vllm.lora.request import LoRARequest

    with open(request_path) as file:
        request = json.load(file)
    prompts, rows = request["prompts"], request["rows"]
    adapters = [LoRARequest(name, int_id, path) for name, int_id, path in request["adapters"]]
    # enforce_eager: no torch.compile, which takes many minutes per engine on a busy 2-core machine.
    common = dict(model=request["model"], dtype=request["dtype"], seed=0, gpu_memory_utilization=MEMORY_UTILIZATION,
                  max_model_len=2048, enforce_eager=request.get("enforce_eager", True))
    base = LLM(**common)
    lora = LLM(**common, enable_lora=True, max_loras=max(count for _, count in rows),
               max_lora_rank=request["rank"])
    params = SamplingParams(temperature=0, max_tokens=request["max_tokens"], ignore_eos=True)
    plans = [(label, [adapters[index % count] if count else None for index in range(len(prompts))])
             for label, count in rows]
    base.generate(prompts, params, use_tqdm=False)
    for _, requests in plans:
        lora.generate(prompts, params, lora_request=requests, use_tqdm=False)
    rates = {"base": []} | {label: [] for label, _ in plans}
    for _ in range(request["rounds"]):
        rates["base"].append(rate(base, prompts, params, None))
        for label, requests in plans:
            rates[label].append(rate(lora, prompts, params, requests))
    with open(result_path, "w") as file:
        json.dump(rates, file)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
