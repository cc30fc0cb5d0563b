"""`python -m shared.native.prebuild --out DIR`: build every C++ kernel of pdserve for every
generic CPU target of this architecture (shared/native/targets.py) into DIR.

The container image runs it at build time (deploy/compose/Dockerfile) and leaves the compiler
out; at run time `PDSERVE_PREBUILT_KERNELS=DIR` makes shared/native/build.py load the best of
these builds for the CPU it finds. Exits 1 naming the kernel and target when a build fails.
"""

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

from shared.native.build import prebuild
from shared.native.targets import machine_targets

SHARED_ROOT = Path(__file__).resolve().parents[1]


def kernel_sources() -> list[Path]:
    """Every C++ kernel source shipped in `shared` (`<package>/csrc/*.cpp`)."""
    return sorted(SHARED_ROOT.glob("**/csrc/*.cpp"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m shared.native.prebuild", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, type=Path, help="folder for the built libraries")
    parser.add_argument("--target", action="append", help="build only this target (repeatable)")
    args = parser.parse_args(argv)
    compiler = shutil.which(os.environ.get("CXX", "g++"))
    if compiler is None:
        print("prebuild: no C++ compiler ($CXX or g++) found", file=sys.stderr)
        return 1
    targets = [t for t in machine_targets() if not args.target or t.name in args.target]
    if not targets:
        print("prebuild: no CPU target to build for on this machine", file=sys.stderr)
        return 1
    for source in kernel_sources():
        for target in targets:
            try:
                library = prebuild(compiler, source, target, args.out)
            except (OSError, subprocess.SubprocessError) as error:
                print(f"prebuild: {source.name} for {target.name} failed: {error}", file=sys.stderr)
                return 1
            print(f"prebuild: {library}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
