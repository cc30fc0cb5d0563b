"""benchmarks/cpu_attention.py runs end to end on a tiny workload and prints its tables."""

import json
from pathlib import Path

import torch

from benchmarks import cpu_attention
from shared.attention.native_decode import load_native_decode

KERNEL_SOURCE = Path(cpu_attention.__file__).parents[1] / "shared" / "attention" / "csrc" / "paged_decode.cpp"


def test_the_attention_benchmark_prints_decode_and_prompt_figures(tmp_path, capsys):
    out = tmp_path / "figures.json"
    assert cpu_attention.main(["--batch", "2", "--contexts", "40", "--prompt-len", "20", "--repeats", "1",
                               "--rotate-mib", "1", "--num-threads", "1", "--baseline-source", str(KERNEL_SOURCE),
                               "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    figures = json.loads(out.read_text())
    # Every path this machine runs is timed, the engine's own among them.
    paths = load_native_decode().available_paths(9, 3, 64, 16, torch.bfloat16)
    assert figures["default_path"] in paths and set(figures["decode"]["40"]) == {f"{p} path" for p in paths} | {"baseline"}
    for path in paths:
        assert f"| {path} path | 40 |" in printed and f"| {path} path, one segment |" in printed
    assert "| baseline | 40 |" in printed and "| baseline, one row each |" in printed
    assert "CPU " in printed and "flags" in printed
