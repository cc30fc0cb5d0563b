"""GGUF -> HF folder: pdserve's converter (shared/model/gguf_convert.py) against transformers'
own GGUF loader (`from_pretrained(gguf_file=...)` + `save_pretrained`), on the default model.

Both dequantize with the gguf package; they differ in the name mapping, the Q/K row order and
the config. Prints the seconds each takes (median of --repeats), whether every weight tensor
is bit-identical, and the config fields that differ.

    .venv/bin/python -m benchmarks.gguf_convert [--repeats 3]
"""

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from shared.model.default_model import default_gguf_path
from shared.model.gguf_convert import WEIGHTS_FILE, convert_gguf_to_hf


def convert_with_pdserve(gguf_path: Path, out_dir: Path) -> None:
    convert_gguf_to_hf(gguf_path, out_dir)


def convert_with_transformers(gguf_path: Path, out_dir: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name,
                                                 dtype=torch.float32)
    model.save_pretrained(out_dir)


def median_seconds(convert, gguf_path: Path, root: Path, repeats: int) -> tuple[float, Path]:
    times = []
    for index in range(repeats):
        out_dir = root / f"{convert.__name__}-{index}"
        started = time.perf_counter()
        convert(gguf_path, out_dir)
        times.append(time.perf_counter() - started)
    return statistics.median(times), out_dir


def compare_weights(ours: Path, theirs: Path) -> dict:
    a, b = load_file(ours / WEIGHTS_FILE), load_file(theirs / WEIGHTS_FILE)
    common = sorted(set(a) & set(b))
    differing = [name for name in common if not torch.equal(a[name], b[name])]
    max_diff = max((float((a[name] - b[name]).abs().max()) for name in differing), default=0.0)
    return {"only_ours": sorted(set(a) - set(b)), "only_theirs": sorted(set(b) - set(a)),
            "num_common": len(common), "num_differing": len(differing), "max_abs_diff": max_diff}


def compare_configs(ours: Path, theirs: Path) -> dict:
    a = json.loads((ours / "config.json").read_text())
    b = json.loads((theirs / "config.json").read_text())
    return {key: [a.get(key), b.get(key)] for key in sorted(set(a) | set(b)) if a.get(key) != b.get(key)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    gguf_path = default_gguf_path()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        ours_s, ours = median_seconds(convert_with_pdserve, gguf_path, root, args.repeats)
        theirs_s, theirs = median_seconds(convert_with_transformers, gguf_path, root, args.repeats)
        report = {"gguf": gguf_path.name, "repeats": args.repeats,
                  "pdserve_convert_s": round(ours_s, 2), "transformers_load_save_s": round(theirs_s, 2),
                  "weights": compare_weights(ours, theirs), "config_differences": compare_configs(ours, theirs)}
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
