"""The offline benchmark's extra modes: beside a CPU hog, and deterministic against default.

`python -m benchmarks.offline --beside-hog` times pdserve's offline engine on the prompt set
quietly, then again while `yes > /dev/null` burns one of this process's CPUs (pinned to the
last CPU of its affinity mask), and prints both figures and their ratio (issue 16's target:
>= 0.45 with one of two cores taken). `--compare-deterministic` times the default engine and
one with `deterministic=True` on the same prompts and prints the slowdown and how many
outputs are identical.
"""

import ctypes
import ctypes.util
import os
import signal
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from shared.model.cpu_budget import allowed_cpus

PR_SET_PDEATHSIG = 1


def _pin_and_die_with_parent(cpu: int) -> None:
    """In the hog before exec: on `cpu` only, and SIGTERMed if the benchmark dies first."""
    os.sched_setaffinity(0, {cpu})
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


@contextmanager
def cpu_hog(cpu: int) -> Iterator[subprocess.Popen]:
    """`yes > /dev/null` pinned to `cpu` while the block runs; stopped (by its pid) afterwards."""
    hog = subprocess.Popen(["yes"], stdout=subprocess.DEVNULL, preexec_fn=lambda: _pin_and_die_with_parent(cpu))
    try:
        time.sleep(0.2)  # let it reach its core before the timed run starts (not a sync point)
        yield hog
    finally:
        hog.terminate()
        hog.wait()


def run_beside_hog(run_pdserve, model_dir: Path, prompt_ids: list[list[int]], args) -> dict:
    """Quiet run, then the same run beside a hog on the last allowed CPU (each with a fresh
    engine, so the second finds no prompt in the prefix cache)."""
    from benchmarks.machine import print_machine

    quiet, _, quiet_llm = run_pdserve(model_dir, prompt_ids, args)
    print_machine(quiet_llm.engine.core.executor.compute_paths)
    hog_cpu = allowed_cpus()[-1]
    with cpu_hog(hog_cpu):
        busy = run_pdserve(model_dir, prompt_ids, args)[0]
    ratio = busy.output_tokens_per_s / quiet.output_tokens_per_s
    print(f"{'run':<22}{'wall s':>10}{'output tok/s':>15}")
    print(f"{'quiet':<22}{quiet.wall_s:>10.2f}{quiet.output_tokens_per_s:>15.1f}")
    print(f"{f'beside a hog on CPU {hog_cpu}':<22}{busy.wall_s:>10.2f}{busy.output_tokens_per_s:>15.1f}")
    print(f"{'hog/quiet':<22}{'':>10}{ratio:>14.2f}x")
    return {"quiet_output_tokens_per_s": quiet.output_tokens_per_s, "hog_cpu": hog_cpu,
            "hog_output_tokens_per_s": busy.output_tokens_per_s, "hog_over_quiet": ratio,
            "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", ""),
            "gomp_spincount": os.environ.get("GOMP_SPINCOUNT", "")}


def run_deterministic_comparison(run_pdserve, model_dir: Path, prompt_ids: list[list[int]], args) -> dict:
    """Default engine, then a deterministic one, on the same prompts."""
    from benchmarks.machine import print_machine

    default, default_ids, default_llm = run_pdserve(model_dir, prompt_ids, args)
    deterministic, deterministic_ids, deterministic_llm = run_pdserve(model_dir, prompt_ids, args, deterministic=True)
    print("default: ", end="")
    print_machine(default_llm.engine.core.executor.compute_paths)
    print("deterministic: ", end="")
    print_machine(deterministic_llm.engine.core.executor.compute_paths, probe_onednn=False)
    slowdown = deterministic.wall_s / default.wall_s
    num_identical = sum(a == b for a, b in zip(default_ids, deterministic_ids))
    print(f"{'engine':<22}{'wall s':>10}{'output tok/s':>15}")
    print(f"{'default':<22}{default.wall_s:>10.2f}{default.output_tokens_per_s:>15.1f}")
    print(f"{'deterministic':<22}{deterministic.wall_s:>10.2f}{deterministic.output_tokens_per_s:>15.1f}")
    print(f"{'deterministic cost':<22}{(slowdown - 1) * 100:>9.1f}% slower")
    print(f"outputs identical to the default engine's: {num_identical}/{len(prompt_ids)}")
    return {"default_output_tokens_per_s": default.output_tokens_per_s,
            "deterministic_output_tokens_per_s": deterministic.output_tokens_per_s,
            "deterministic_slowdown": slowdown, "num_identical_to_default": num_identical}
