"""benchmarks/cpu_attention.py runs end to end on a tiny workload and prints its tables."""

from pathlib import Path

from benchmarks import cpu_attention

KERNEL_SOURCE = Path(cpu_attention.__file__).parents[1] / "shared" / "attention" / "csrc" / "paged_decode.cpp"


def test_the_attention_benchmark_prints_decode_and_prompt_figures(tmp_path, capsys):
    out = tmp_path / "figures.json"
    assert cpu_attention.main(["--batch", "2", "--contexts", "40", "--prompt-len", "20", "--repeats", "1",
                               "--rotate-mib", "1", "--threads", "1", "--baseline-source", str(KERNEL_SOURCE),
                               "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "| this kernel | 40 |" in printed and "| baseline | 40 |" in printed
    assert "| this kernel, one segment |" in printed and "| baseline, one row each |" in printed
    assert out.exists()
