"""Where an engine step's wall time goes: the model's forward pass against the Python around it.

`python -m benchmarks.step_overhead [--num-prompts 64 --output-len 64 --num-threads 2]` runs
the offline engine (`shared.engine.LLM`, bf16 SmolLM2 by default, greedy, EOS ignored) on the
offline benchmark's prompts (128-256 tokens of common words, fixed seed) and splits each
`LLMEngine.step` into:

- schedule: `EngineCore._schedule` (the scheduler's decision, stats, guided masks);
- inputs: `build_model_inputs` (token ids, positions, slots, block tables, logits rows) plus the
  attention backend's `prepare` (per-step masks and native-kernel inputs, run inside forward);
- forward: the model's forward pass without its `prepare`;
- sampling: `ModelRunner._sample` (sampling rows, the sampler, the tokens back as ints);
- update: `EngineCore._apply` (the scheduler takes the tokens, stop checks, core outputs);
- detokenize: `OutputProcessor.process` (text, stop strings, request outputs);
- other: the rest of the step (the executor call, thread governor, finishing, KV polling).

Timing wraps those methods on this one engine's objects (nothing in the engine changes) with
`time.perf_counter`; on a CPU every torch call has finished when it returns. Steps are grouped
into decode-only steps with every prompt running, decode-only steps with fewer rows (the
tail), and steps that compute prompt tokens. Figures are per step (ms) and shares of the step.
"""

import argparse
import hashlib
import os
import time
from collections import defaultdict
from dataclasses import dataclass, field

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from shared.model.cpu_budget import prefer_bounded_spinning  # noqa: E402

prefer_bounded_spinning()  # before torch loads the OpenMP runtime

import torch  # noqa: E402
from benchmarks.engine_flags import add_engine_arguments, engine_args_from  # noqa: E402

PARTS = ("schedule", "inputs", "forward", "sampling", "update", "detokenize")


@dataclass
class StepRecord:
    kind: str = "idle"
    num_rows: int = 0
    seconds: dict[str, float] = field(default_factory=lambda: defaultdict(float))


class StepTimer:
    """Wraps the engine's step parts on one engine instance and records each step."""

    def __init__(self) -> None:
        self.steps: list[StepRecord] = []
        self.current = StepRecord()

    def timed(self, part: str, function):
        def wrapper(*args, **kwargs):
            started = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                self.current.seconds[part] += time.perf_counter() - started
        return wrapper

    def install(self, llm) -> None:
        import shared.executor.model_runner as model_runner_module

        engine, core = llm.engine, llm.engine.core
        runner = core.executor.runner
        schedule = core._schedule

        def schedule_and_classify():
            scheduler_output, failed = schedule()
            self.current.num_rows = len(scheduler_output.scheduled)
            prompt_rows = sum(not item.is_decode for item in scheduler_output.scheduled)
            self.current.kind = "prompt" if prompt_rows else "decode"
            return scheduler_output, failed

        core._schedule = self.timed("schedule", schedule_and_classify)
        model_runner_module.build_model_inputs = self.timed("inputs", model_runner_module.build_model_inputs)
        backend = runner.model.attn_backend
        backend.prepare = self.timed("prepare", backend.prepare)
        runner.model = _TimedModule(runner.model, self.timed("forward", runner.model))
        runner._sample = self.timed("sampling", runner._sample)
        core._apply = self.timed("update", core._apply)
        engine.output_processor.process = self.timed("detokenize", engine.output_processor.process)
        step = engine.step

        def timed_step():
            self.current = StepRecord()
            started = time.perf_counter()
            outputs = step()
            self.current.seconds["step"] = time.perf_counter() - started
            self.steps.append(self.current)
            return outputs

        engine.step = timed_step

    def breakdown(self, records: list[StepRecord]) -> dict[str, float]:
        """Mean ms per step of each part (prepare moved from forward to inputs) and other."""
        totals = defaultdict(float)
        for record in records:
            for part, seconds in record.seconds.items():
                totals[part] += seconds
        count = len(records)
        ms = {part: 1000 * totals[part] / count for part in (*PARTS, "prepare", "step")}
        ms["forward"] -= ms["prepare"]
        ms["inputs"] += ms.pop("prepare")
        ms["other"] = ms["step"] - sum(ms[part] for part in PARTS)
        return ms


class _TimedModule:
    """Stands in for the model: calls go through the timer, attributes reach the model."""

    def __init__(self, model, timed_call):
        self._model, self._timed_call = model, timed_call

    def __call__(self, *args, **kwargs):
        return self._timed_call(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._model, name)


def group_steps(steps: list[StepRecord], num_prompts: int) -> dict[str, list[StepRecord]]:
    groups = {f"decode, batch {num_prompts}": [], "decode, fewer rows": [], "with prompt tokens": []}
    for record in steps:
        if record.kind == "prompt":
            groups["with prompt tokens"].append(record)
        elif record.kind == "decode":
            key = f"decode, batch {num_prompts}" if record.num_rows == num_prompts else "decode, fewer rows"
            groups[key].append(record)
    return groups


def print_table(timer: StepTimer, groups: dict[str, list[StepRecord]]) -> None:
    columns = (*PARTS, "other", "step")
    print(f"{'steps':<22}{'n':>5}" + "".join(f"{name:>16}" for name in columns))
    for name, records in groups.items():
        if not records:
            continue
        ms = timer.breakdown(records)
        cells = [f"{ms[part]:8.1f} ({100 * ms[part] / ms['step']:4.1f}%)" for part in columns[:-1]]
        print(f"{name:<22}{len(records):>5}" + "".join(f"{cell:>16}" for cell in cells) + f"{ms['step']:>16.1f}")
    print("ms per step (share of the step)")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-prompts", type=int, default=64)
    parser.add_argument("--output-len", type=int, default=64, help="new tokens per prompt")
    add_engine_arguments(parser, "dtype", "model", "num_threads")
    parser.add_argument("--seed", type=int, default=0, help="seed for prompt lengths and words")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    from benchmarks.machine import print_machine
    from benchmarks.offline import load_workload
    from shared.engine import LLM, SamplingParams

    model_dir, prompt_ids = load_workload(args)
    llm = LLM.from_engine_args(engine_args_from(args, model=str(model_dir), num_threads=torch.get_num_threads()))
    print_machine(llm.engine.core.executor.compute_paths)
    llm.generate([ids[:16] for ids in prompt_ids[:2]], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    timer = StepTimer()
    timer.install(llm)
    started = time.perf_counter()
    outputs = llm.generate(prompt_ids, SamplingParams(temperature=0, max_tokens=args.output_len, ignore_eos=True))
    wall_s = time.perf_counter() - started
    num_output_tokens = sum(len(output.outputs[0].token_ids) for output in outputs)
    stepped_s = sum(record.seconds["step"] for record in timer.steps)
    digest = hashlib.sha256(str([list(output.outputs[0].token_ids) for output in outputs]).encode()).hexdigest()
    print(f"{len(timer.steps)} steps, {wall_s:.2f} s, {num_output_tokens / wall_s:.1f} output tok/s; "
          f"outside steps {1000 * (wall_s - stepped_s):.0f} ms (adding requests, the generate loop); "
          f"output ids sha256 {digest[:16]} (compare runs of one tree against another)\n")
    print_table(timer, group_steps(timer.steps, args.num_prompts))
    llm.shutdown()


if __name__ == "__main__":
    main()
