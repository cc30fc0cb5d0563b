"""README.md and docs/*.md name files and code in backticks; a rename must not leave them stale.

- A backticked repository path must exist, from the root or as the tail of a path in the tree:
  `shared/engine/frontend.py`, `core/scheduler.py`, `core_loop.py`, `tests/unit/test_triton_*.py`.
  Checked: spans with a / that start at a top-level folder, end in / or in a source suffix, and
  bare file names with a source suffix. Output files (`results.json`, `latency.png`) and other
  slashes (`get/patch`, `pdserve.v1.Gateway/Generate`) are not repository paths.
- A backticked code name must be something the Python sources define or spell out (a function,
  class, attribute, assigned name, keyword, imported name, module, or a string that is a
  name: settings keys, JSON fields, span names); a parameter or a word in a comment is not
  enough. Code names are CamelCase or snake_case identifiers, dotted chains of them
  (`EngineCore.finish_step_sends`, `shared.engine.core_process`), and calls
  (`execute_model(SchedulerOutput)`: the callee, and CamelCase arguments as type names).
- Neither: command lines, flags, environment variables, metric names, JSON snippets.
Generated reports in docs' subfolders are left out: their tools rewrite them.
"""

import ast
import os
import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SKIPPED_DIRS = {".git", ".venv", "node_modules", "__pycache__", ".pytest_cache", "build"}
SOURCE_SUFFIXES = ("py", "pyi", "proto", "cpp", "h", "sh", "toml", "yml", "yaml")
TOP_LEVEL = {"shared", "services", "benchmarks", "scripts", "tests", "docs", "deploy", "proto"}
CAMEL_CASE = r"[A-Z][a-z0-9]+(?:[A-Z][a-z0-9]*)+|[A-Z]{2,}[a-z]\w*"
SNAKE_CASE = r"[a-z][a-z0-9]*(?:_[a-z0-9]+)+"

# Names a doc gives in backticks that are not this repository's, each with its reason.
NOT_IN_THE_REPO = {
    "deploy/compose/certs": "written by `pdserve certs --out deploy/compose/certs`",
    "lru_cache": "transformers' cache of compiled chat templates (docs/operations.md, Memory)",
    "epoll_wait": "the system call a sleeping process waits in",
    "memory.move_charge_at_immigrate": "a cgroup v1 file",
    "memory.oom_control": "a cgroup v1 file",
    "cpu.cfs_quota_us": "a cgroup v1 file",
    "cpu.cfs_period_us": "a cgroup v1 file",
    "sch_netem": "a Linux kernel module",
    "sch_prio": "a Linux kernel module",
    "ping_timeout": "a ucxx/UCX setting",
    "shm_size": "a Docker Compose key",
    "torch_shm_manager": "torch's helper binary",
    "posix_fallocate": "the libc call the file tier uses through os",
    "adapter_model.safetensors": "a file of a peft adapter folder",
    "ZmqEventPublisher": "vLLM's KV-event publisher, whose wire format pdserve's follows",
    "vllm.distributed.kv_events.KVEventBatch": "vLLM's KV-event batch class",
    "hash_block_tokens": "vLLM's block hash function, which sha256_cbor reproduces",
    "sys.set_int_max_str_digits": "Python's limit on integer digits, which docs/bad_input.md explains",
}


def doc_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def backticked(text: str) -> list[str]:
    """Inline code spans outside fenced blocks."""
    prose = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return [span.strip() for span in re.findall(r"`([^`\n]+)`", prose)]


@cache
def repo_paths() -> frozenset[str]:
    """Every file and folder of the tree, relative to the root, folders with a trailing /."""
    paths = set()
    for folder, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if d not in SKIPPED_DIRS and not d.endswith(".egg-info")]
        rel = Path(folder).relative_to(ROOT).as_posix()
        prefix = "" if rel == "." else f"{rel}/"
        paths.update(f"{prefix}{d}/" for d in dirs)
        paths.update(f"{prefix}{f}" for f in files)
    return frozenset(paths)


@cache
def defined_names() -> frozenset[str]:
    this_test = Path(__file__).resolve()
    names = set()
    for path in repo_paths():
        if path.endswith((".py", ".pyi")) and (ROOT / path).resolve() != this_test:
            names.add(Path(path).stem)
            names.update(Path(path).parent.parts)
            for node in ast.walk(ast.parse((ROOT / path).read_bytes())):
                names.update(_named_by(node))
    return frozenset(names)


def _named_by(node: ast.AST) -> list[str]:
    match node:
        case ast.FunctionDef(name=name) | ast.AsyncFunctionDef(name=name) | ast.ClassDef(name=name):
            return [name]
        case ast.Name(id=name, ctx=ast.Store()) | ast.Attribute(attr=name):
            return [name]
        case ast.keyword(arg=str(name)):
            return [name]
        case ast.alias(name=name, asname=asname):
            return [asname or name.rsplit(".", 1)[-1]]
        case ast.Constant(value=str(text)) if re.fullmatch(r"\w+(\.\w+)*", text):
            return text.split(".")
    return []


def is_repo_path(span: str) -> bool:
    if not re.fullmatch(r"[\w.*/-]+", span) or span.startswith(("/", "-", ".")):
        return False
    with_source_suffix = re.fullmatch(rf".*\w\.({'|'.join(SOURCE_SUFFIXES)})", span) is not None
    if "/" not in span:
        return with_source_suffix
    return span.split("/", 1)[0] in TOP_LEVEL or span.endswith("/") or with_source_suffix


def path_exists(span: str) -> bool:
    pattern = re.escape(span.rstrip("/")).replace(r"\*", r"[^/]*")
    wanted = re.compile(rf"(.*/)?{pattern}/?")
    return any(wanted.fullmatch(path) for path in repo_paths())


def missing_code_names(span: str) -> list[str]:
    call = re.fullmatch(r"([A-Za-z_][\w.]*)\((.*)\)", span)
    if call:
        callee, args = call.groups()
        type_names = [] if "=" in args else [a for a in re.findall(r"\w+", args) if re.fullmatch(CAMEL_CASE, a)]
        return missing_code_names(callee) + [name for name in type_names if name not in defined_names()]
    if not re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*", span):
        return []
    parts = span.split(".")
    if not any(re.fullmatch(f"{CAMEL_CASE}|{SNAKE_CASE}", part) for part in parts):
        return []
    return [part for part in parts if part not in defined_names()]


def stale_names(doc: Path) -> list[str]:
    stale = []
    for span in backticked(doc.read_text()):
        if span in NOT_IN_THE_REPO:
            continue
        if is_repo_path(span):
            stale += [] if path_exists(span) else [span]
        else:
            stale += [f"{name} (in `{span}`)" for name in missing_code_names(span)]
    return stale


@pytest.mark.parametrize("doc", doc_files(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_backticked_path_and_code_name_exists(doc):
    stale = stale_names(doc)
    assert not stale, f"{doc.relative_to(ROOT)} names what the tree lacks: {stale}"


@pytest.mark.parametrize("span", [
    "shared/executor/isolation.py", "QueryResult", "has_remote_kv", "has_arrived",
    "EngineCore.no_such_method", "no_such_module.py", "services/no_such_folder",
    "frontend_of(EngineFrontend)", "execute_model(NoSuchOutput)",
])
def test_a_stale_name_is_caught(tmp_path, span):
    doc = tmp_path / "doc.md"
    doc.write_text(f"Text naming `{span}` in passing.\n")
    assert stale_names(doc)


@pytest.mark.parametrize("span", [
    "make bench-soak", "--kv-peer-timeout-s", "PDSERVE_MAX_PROMPT_BYTES", "kv_cache_memory_gb = 2",
    "pdserve:gateway_requests_shed_total", '{"type": "json_object"}', "vllm:spec_decode_*",
    "/dev/shm", "x86-64-v3", "ipc://", "GET /metrics", "root ::= root", "results.json",
    "get/patch", "pdserve.v1.Gateway/Generate", ".venv/bin/pdserve generate",
    "shared/isolation.py", "core_loop.py", "attention/csrc/", "tests/unit/test_triton_*.py",
    "CallResult", "EngineCore.finish_step_sends", "execute_model(SchedulerOutput)",
    "shared.engine.core_process", "top_k", "engine_core.queue_wait",
])
def test_what_is_not_a_stale_name_passes(tmp_path, span):
    doc = tmp_path / "doc.md"
    doc.write_text(f"Text naming `{span}` in passing.\n")
    assert not stale_names(doc)
