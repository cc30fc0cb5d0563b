"""`make bench-offline BENCH_ARGS="--parallel"`: the offline engine at several TP x PP layouts.

One torch thread per rank, and the single-process engine with 1 and 2 threads for a base. For each layout:
wall time, output tokens/s, engine steps, time per step, and the time per step the output rank
spent in communication calls (all-reduces, all-gathers, stage-to-stage receives; the waits for
a slower peer are inside these calls, so on an oversubscribed machine this also counts time
spent waiting for CPU). Greedy outputs are compared with the single-process row.
"""

import time
from pathlib import Path
from typing import Any

# (tensor, pipeline, threads per rank); SmolLM2 has 9 heads and 3 KV heads: TP is 1 or 3.
LAYOUTS = ((1, 1, 1), (1, 1, 2), (3, 1, 1), (1, 2, 1))


def parse_layouts(text: str) -> tuple[tuple[int, int, int], ...]:
    """"1x1,1x1:2,1x2" -> ((1, 1, 1), (1, 1, 2), (1, 2, 1)): tensor x pipeline[:threads per rank]."""
    layouts = []
    for item in text.split(","):
        sizes, _, threads = item.partition(":")
        tp, pp = (int(part) for part in sizes.split("x"))
        layouts.append((tp, pp, int(threads or 1)))
    return tuple(layouts)


def run_layout(model_dir: Path, prompt_ids: list[list[int]], dtype: str, output_len: int,
               tp: int, pp: int, threads: int) -> dict[str, Any]:
    from shared.engine import LLM, SamplingParams
    params = SamplingParams(temperature=0, max_tokens=output_len, ignore_eos=True)
    with LLM(model=str(model_dir), dtype=dtype, num_threads=threads, tensor_parallel_size=tp,
             pipeline_parallel_size=pp) as llm:
        llm.generate([ids[:16] for ids in prompt_ids[:2]], SamplingParams(temperature=0, max_tokens=4))
        executor = llm.engine.core.executor
        steps_before, comm_before = getattr(executor, "num_steps", 0), getattr(executor, "comm_seconds_total", 0.0)
        started = time.perf_counter()
        outputs = llm.generate(prompt_ids, params)
        wall_s = time.perf_counter() - started
        steps = getattr(executor, "num_steps", 0) - steps_before
        comm_s = getattr(executor, "comm_seconds_total", 0.0) - comm_before
    token_ids = [list(output.token_ids) for output in outputs]
    return {"layout": f"TP{tp} x PP{pp}" + (f" ({threads} thr)" if threads > 1 else ""), "ranks": tp * pp, "wall_s": wall_s,
            "output_tokens_per_s": sum(map(len, token_ids)) / wall_s, "steps": steps,
            "ms_per_step": 1000 * wall_s / steps if steps else None,
            "comm_ms_per_step": 1000 * comm_s / steps if steps else None, "token_ids": token_ids}


def run_parallel_rows(model_dir: Path, prompt_ids: list[list[int]], dtype: str, output_len: int,
                      layouts=LAYOUTS) -> list[dict[str, Any]]:
    rows = [run_layout(model_dir, prompt_ids, dtype, output_len, *layout) for layout in layouts]
    base = rows[0]["token_ids"]
    print(f"\n{'layout':<20}{'ranks':>6}{'wall s':>9}{'out tok/s':>11}{'steps':>7}"
          f"{'ms/step':>9}{'comm ms/step':>14}{'same tokens':>13}")
    for row in rows:
        comm = "-" if row["comm_ms_per_step"] is None else f"{row['comm_ms_per_step']:.1f}"
        same = sum(a == b for a, b in zip(row.pop("token_ids"), base))
        row["num_outputs_identical_to_first_row"] = same
        step_ms = "-" if row["ms_per_step"] is None else f"{row['ms_per_step']:.1f}"
        print(f"{row['layout']:<20}{row['ranks']:>6}{row['wall_s']:>9.2f}{row['output_tokens_per_s']:>11.1f}"
              f"{row['steps']:>7}{step_ms:>9}{comm:>14}{same:>9}/{len(base)}")
    return rows
