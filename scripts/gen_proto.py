#!/usr/bin/env python3
"""Regenerate (or check) the checked-in Python stubs for every `proto/**/*.proto`.

Called by `make proto` and by tests/unit/test_proto_drift.py. Commit policy: the generated
files under `shared/pb/pdserve/` are checked in; after editing a .proto, run

    .venv/bin/python scripts/gen_proto.py           # rewrite shared/pb/pdserve/
    .venv/bin/python scripts/gen_proto.py --check   # exit 1 if the checked-in stubs are stale

Stubs are produced by grpc_tools.protoc (`*_pb2.py`, `*_pb2.pyi`, `*_pb2_grpc.py`) into a
temporary folder, then their `pdserve.` imports are rewritten to `shared.pb.pdserve.` so the
stubs import as part of the `shared` package, and an `__init__.py` is added to each folder.
`shared/pb/__init__.py` is hand-written and not touched.
"""

from __future__ import annotations

import argparse
import logging
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_PROTO_ROOT = REPO_ROOT / "proto"
DEFAULT_OUT_ROOT = REPO_ROOT / "shared" / "pb"
GENERATED_TOP_PACKAGE = "pdserve"
IMPORT_PREFIX = "shared.pb."
INIT_TEXT = '"""Generated protobuf stubs; regenerate with scripts/gen_proto.py. Do not edit."""\n'
_PDSERVE_IMPORT = re.compile(r"^(from|import) pdserve\.", flags=re.MULTILINE)

logger = logging.getLogger("gen_proto")


def find_proto_files(proto_root: Path) -> list[Path]:
    """Every .proto under `proto_root`, sorted so the output does not depend on the filesystem."""
    return sorted(proto_root.rglob("*.proto"))


def run_protoc(proto_root: Path, proto_files: list[Path], out_dir: Path) -> None:
    """Run grpc_tools.protoc on `proto_files`, writing stubs under `out_dir`."""
    command = [
        sys.executable, "-m", "grpc_tools.protoc", f"-I{proto_root}",
        f"--python_out={out_dir}", f"--pyi_out={out_dir}", f"--grpc_python_out={out_dir}",
        *[str(path.relative_to(proto_root)) for path in proto_files],
    ]
    completed = subprocess.run(command, cwd=proto_root, capture_output=True, text=True)
    if completed.returncode != 0:
        raise RuntimeError(f"protoc failed ({completed.returncode}):\n{completed.stderr}")


def rewrite_imports(generated_root: Path) -> None:
    """Point `from pdserve.v1 import x_pb2` at `shared.pb.pdserve.v1` in every stub."""
    for path in sorted(generated_root.rglob("*.py*")):
        text = path.read_text()
        path.write_text(_PDSERVE_IMPORT.sub(rf"\1 {IMPORT_PREFIX}pdserve.", text))


def add_package_inits(generated_root: Path) -> None:
    """Give every generated folder an `__init__.py` so it imports as a regular package."""
    for folder in [generated_root, *sorted(p for p in generated_root.rglob("*") if p.is_dir())]:
        (folder / "__init__.py").write_text(INIT_TEXT)


def generate_tree(proto_root: Path, scratch_dir: Path) -> Path:
    """Generate the full stub tree into `scratch_dir`; returns its `pdserve/` folder."""
    proto_files = find_proto_files(proto_root)
    if not proto_files:
        raise RuntimeError(f"no .proto files under {proto_root}")
    run_protoc(proto_root, proto_files, scratch_dir)
    generated_root = scratch_dir / GENERATED_TOP_PACKAGE
    rewrite_imports(generated_root)
    add_package_inits(generated_root)
    return generated_root


def read_tree(root: Path) -> dict[str, bytes]:
    """Map each file's path relative to `root` to its bytes (caches are skipped)."""
    if not root.is_dir():
        return {}
    return {
        str(path.relative_to(root)): path.read_bytes()
        for path in sorted(root.rglob("*"))
        if path.is_file() and "__pycache__" not in path.parts
    }


def diff_trees(expected: dict[str, bytes], actual: dict[str, bytes]) -> list[str]:
    """One line per file that is missing, stale or unexpected in `actual`."""
    problems = [f"missing: {name}" for name in sorted(expected.keys() - actual.keys())]
    problems += [f"unexpected: {name}" for name in sorted(actual.keys() - expected.keys())]
    problems += [
        f"stale: {name}" for name in sorted(expected.keys() & actual.keys())
        if expected[name] != actual[name]
    ]
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if checked-in stubs differ")
    parser.add_argument("--proto-root", type=Path, default=DEFAULT_PROTO_ROOT)
    parser.add_argument("--out-root", type=Path, default=DEFAULT_OUT_ROOT)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    checked_in_root = args.out_root / GENERATED_TOP_PACKAGE
    with tempfile.TemporaryDirectory() as scratch:
        generated_root = generate_tree(args.proto_root.resolve(), Path(scratch))
        problems = diff_trees(read_tree(generated_root), read_tree(checked_in_root))
        if args.check:
            for problem in problems:
                logger.error("proto drift: %s (under %s)", problem, checked_in_root)
            if problems:
                logger.error("run: python scripts/gen_proto.py")
            return 1 if problems else 0
        shutil.rmtree(checked_in_root, ignore_errors=True)
        shutil.copytree(generated_root, checked_in_root)
    logger.info("wrote %s (%d changes)", checked_in_root, len(problems))
    return 0


if __name__ == "__main__":
    sys.exit(main())
