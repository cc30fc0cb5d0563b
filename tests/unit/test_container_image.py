"""deploy/compose/Dockerfile and what `make image` feeds it, read as files (the image itself is
built and run by `make image` / `make test-compose`): base image and torch source are build
arguments whose defaults suit a user anywhere, the image stage gets no compiler and no tests,
and this machine's pip configuration becomes build arguments without any host path."""

import importlib.util
import re
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = (REPO_ROOT / "deploy" / "compose" / "Dockerfile").read_text()
IMAGE_STAGE = DOCKERFILE[DOCKERFILE.rindex("\nFROM "):]


def load_pip_args_script():
    spec = importlib.util.spec_from_file_location("image_pip_args", REPO_ROOT / "scripts" / "image_pip_args.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def arg_default(name: str) -> str | None:
    match = re.search(rf"^ARG {name}(?:=(.*))?$", DOCKERFILE, re.M)
    assert match, f"no ARG {name}"
    return match.group(1)


def test_base_image_and_torch_source_are_build_arguments_with_defaults_for_anywhere():
    assert arg_default("BASE_IMAGE") == "python:3.11-slim-bookworm"
    assert arg_default("TORCH_INDEX_URL").startswith("https://") and arg_default("TORCH_INDEX_URL").endswith("/whl/cpu")
    stages = re.findall(r"^FROM (\S+)", DOCKERFILE, re.M)
    assert stages == ["${BASE_IMAGE}"] * 3, "every stage on the one base (requirements, build, image)"
    for name in ("PIP_INDEX_URL", "PIP_FIND_LINKS", "PIP_CERT", "PIP_CONSTRAINT"):
        assert arg_default(name) is None, f"{name}: unset by default, so pip keeps its own default"


def test_the_image_stage_has_no_compiler_no_tests_and_prebuilt_kernels():
    assert "apt-get" not in IMAGE_STAGE and "g++" not in IMAGE_STAGE
    assert "COPY --from=build /opt/pdserve /opt/pdserve" in IMAGE_STAGE
    assert "PDSERVE_PREBUILT_KERNELS=/opt/pdserve/kernels" in IMAGE_STAGE
    assert "python -m shared.native.prebuild --out /opt/pdserve/kernels" in DOCKERFILE
    assert not re.search(r"^COPY (tests|benchmarks|docs)\b", DOCKERFILE, re.M)
    ignored = (REPO_ROOT / ".dockerignore").read_text().split()
    assert {"tests", ".git", ".venv", "build/*", "!build/image"} <= set(ignored)


def test_the_cpu_image_leaves_triton_out():
    assert arg_default("LEAVE_OUT") == "triton"
    assert "pip uninstall -y ${LEAVE_OUT}" in DOCKERFILE


def test_pip_config_list_is_read_with_environment_variables_winning():
    module = load_pip_args_script()
    output = ("global.cert='/etc/ca.pem'\nglobal.find-links='/opt/wheels'\n"
              "global.extra-index-url='file:///opt/pypi/simple https://mirror.invalid/simple'\n"
              "install.default-timeout='60'\n:env:.default-timeout='180'\nnot a setting\n")
    assert module.parse_config_list(output) == {
        "cert": "/etc/ca.pem", "find-links": "/opt/wheels", "default-timeout": "180",
        "extra-index-url": "file:///opt/pypi/simple https://mirror.invalid/simple"}


def test_host_paths_become_staged_files_and_local_indexes_are_left_out(tmp_path):
    module = load_pip_args_script()
    (tmp_path / "ca.pem").write_text("CA")
    (tmp_path / "constraints.txt").write_text("torch<=3")
    stage = tmp_path / "stage"
    (stage / "wheels").mkdir(parents=True)
    wheel = stage / "wheels" / "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"
    settings = {"cert": str(tmp_path / "ca.pem"), "constraint": str(tmp_path / "constraints.txt"),
                "find-links": "/opt/wheels", "index-url": "https://index.invalid/simple",
                "extra-index-url": "file:///opt/pypi/simple https://mirror.invalid/simple", "default-timeout": "180"}
    args = module.build_args(settings, stage, wheel)
    assert args == {"PIP_CERT": "/opt/pip-files/cert.pem", "PIP_CONSTRAINT": "/opt/pip-files/constraints-0.txt",
                    "PIP_INDEX_URL": "https://index.invalid/simple", "PIP_EXTRA_INDEX_URL": "https://mirror.invalid/simple",
                    "PIP_FIND_LINKS": "/opt/pip-files/wheels", "TORCH_INDEX_URL": "", "PIP_DEFAULT_TIMEOUT": "180"}
    assert (stage / "cert.pem").read_text() == "CA" and (stage / "constraints-0.txt").read_text() == "torch<=3"


def test_a_torch_wheel_with_cuda_keeps_the_cpu_index():
    module = load_pip_args_script()
    wheel = Path("/stage/wheels/torch-2.13.0-cp311-cp311-manylinux_2_28_x86_64.whl")
    args = module.build_args({}, Path("/stage"), wheel)
    assert "TORCH_INDEX_URL" not in args and args["PIP_FIND_LINKS"] == "/opt/pip-files/wheels"
