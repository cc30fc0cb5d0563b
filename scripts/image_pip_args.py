"""Build arguments that make pip in the image build (deploy/compose/Dockerfile) get packages the
way pip gets them on this machine; `make image` (scripts/image.sh) passes them on.

Reads pip's effective configuration (`pip config list`: its config files and PIP_* variables)
and stages in STAGE_DIR (copied to /opt/pip-files in the build stage) what a container cannot
reach on the host's disk:

- the CA bundle pip trusts (`cert`), as PIP_CERT;
- constraint files (`constraint`), as PIP_CONSTRAINT;
- the torch wheel pip installs here for the image's Python, as PIP_FIND_LINKS; when it is a
  CPU build (`+cpu`), TORCH_INDEX_URL is emptied so that pip takes it, otherwise the
  Dockerfile's default (the PyTorch CPU index) stays;
- index URLs (`index-url`, `extra-index-url`), `trusted-host` and `default-timeout` as they
  are; indexes and find-links on the local disk (file://, folders) do not reach a container
  and are left out.

Prints one NAME=VALUE per line for `docker build --build-arg`.
"""

import argparse
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

IN_IMAGE_DIR = "/opt/pip-files"
# pip config keys by precedence: later sections override earlier ones.
SECTIONS = ("global", "download", "install", ":env:")
PASSED_AS_IS = {"trusted-host": "PIP_TRUSTED_HOST", "default-timeout": "PIP_DEFAULT_TIMEOUT"}


def pip_config(python: str) -> dict[str, str]:
    """pip's effective settings, from `pip config list` lines like `global.cert='/x'`."""
    output = subprocess.run([python, "-m", "pip", "config", "list"], capture_output=True, text=True,
                            check=True).stdout
    return parse_config_list(output)


def parse_config_list(output: str) -> dict[str, str]:
    by_section: dict[str, dict[str, str]] = {}
    for line in output.splitlines():
        match = re.fullmatch(r"(:env:|[\w-]+)\.([\w-]+)='(.*)'", line.strip())
        if match:
            section, key, value = match.groups()
            by_section.setdefault(section, {})[key] = value
    settings: dict[str, str] = {}
    for section in SECTIONS:
        settings.update(by_section.get(section, {}))
    return settings


def is_remote(url: str) -> bool:
    return url.startswith(("http://", "https://"))


def torch_requirement(pyproject: Path) -> str:
    dependencies = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
    return next(d for d in dependencies if d.startswith("torch=="))


def stage_torch_wheel(python: str, requirement: str, python_version: str, wheels_dir: Path) -> Path | None:
    """The torch wheel pip picks here for `python_version`, downloaded into `wheels_dir`."""
    wheels_dir.mkdir(parents=True, exist_ok=True)
    command = [python, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version",
               python_version, "--dest", str(wheels_dir), requirement]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        print(f"image_pip_args: pip could not download {requirement}:\n{result.stderr[-2000:]}", file=sys.stderr)
        return None
    version = requirement.split("==", 1)[1]
    wheels = sorted(wheels_dir.glob(f"torch-{version}*.whl"))
    for stale in set(wheels_dir.glob("*.whl")) - set(wheels[-1:]):
        stale.unlink()
    return wheels[-1] if wheels else None


def build_args(settings: dict[str, str], stage_dir: Path, torch_wheel: Path | None) -> dict[str, str]:
    args: dict[str, str] = {}
    if settings.get("cert"):
        shutil.copyfile(settings["cert"], stage_dir / "cert.pem")
        args["PIP_CERT"] = f"{IN_IMAGE_DIR}/cert.pem"
    constraints = settings.get("constraint", "").split()
    for number, constraint in enumerate(constraints):
        shutil.copyfile(constraint, stage_dir / f"constraints-{number}.txt")
    if constraints:
        args["PIP_CONSTRAINT"] = " ".join(f"{IN_IMAGE_DIR}/constraints-{n}.txt" for n in range(len(constraints)))
    if is_remote(settings.get("index-url", "")):
        args["PIP_INDEX_URL"] = settings["index-url"]
    extra = [url for url in settings.get("extra-index-url", "").split() if is_remote(url)]
    if extra:
        args["PIP_EXTRA_INDEX_URL"] = " ".join(extra)
    find_links = [url for url in settings.get("find-links", "").split() if is_remote(url)]
    if torch_wheel is not None:
        find_links.insert(0, f"{IN_IMAGE_DIR}/{torch_wheel.parent.name}")
        if "+cpu" in torch_wheel.name:
            args["TORCH_INDEX_URL"] = ""
    if find_links:
        args["PIP_FIND_LINKS"] = " ".join(find_links)
    for key, name in PASSED_AS_IS.items():
        if settings.get(key):
            args[name] = settings[key]
    return args


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stage-dir", type=Path, required=True, help="folder to stage files in (emptied first, "
                                                                      "except downloaded wheels)")
    parser.add_argument("--python", default=sys.executable, help="the Python whose pip configuration counts")
    parser.add_argument("--python-version", default="3.11", help="the image's Python version (for the wheel)")
    parser.add_argument("--pyproject", type=Path, default=Path("pyproject.toml"))
    args = parser.parse_args(argv)
    args.stage_dir.mkdir(parents=True, exist_ok=True)
    for staged in args.stage_dir.iterdir():
        if staged.is_file():
            staged.unlink()
    settings = pip_config(args.python)
    wheel = stage_torch_wheel(args.python, torch_requirement(args.pyproject), args.python_version,
                              args.stage_dir / "wheels")
    for name, value in build_args(settings, args.stage_dir, wheel).items():
        print(f"{name}={value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
