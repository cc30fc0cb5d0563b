"""`LLM(tensor_parallel_size=...)` in a plain script, as a user writes one: no main guard.

Each test runs a real script in a fresh interpreter. Parallel workers are started as
`python -m shared.executor.worker_main`, so they never import the user's `__main__`: the
script's top level runs exactly once (it appends its pid to a file each time it runs), the
fp32 greedy tokens equal the single-process engine's, and the run leaves no shared memory
behind (a worker's resource tracker would unlink the engine's rings and warn at exit).
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from shared.engine import LLM, SamplingParams

PROMPTS = [[5, 9, 13, 2, 40, 41], [7, 8, 9, 10, 11, 12, 13, 14, 15]]
MAX_TOKENS = 6
ENGINE = dict(dtype="float32", num_blocks=32)
SCRIPT_TIMEOUT_S = 240

SCRIPT = """\
import json, os
from shared.engine import LLM, SamplingParams
with open({runs_file!r}, "a") as runs:
    runs.write(f"{{os.getpid()}}\\n")
greedy = SamplingParams(temperature=0, max_tokens={max_tokens}, ignore_eos=True)
tokens = {{}}
for tp, pp in {layouts!r}:
    llm = LLM(model={model!r}, dtype="float32", num_blocks=32, tensor_parallel_size=tp, pipeline_parallel_size=pp)
    tokens[f"tp={{tp}} pp={{pp}}"] = [list(output.token_ids) for output in llm.generate({prompts!r}, greedy)]
print(json.dumps(tokens))
"""


@pytest.fixture(scope="module")
def single_process_tokens(tiny_llama_folder):
    llm = LLM(model=str(tiny_llama_folder), **ENGINE)
    greedy = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    return [list(output.token_ids) for output in llm.generate(PROMPTS, greedy)]


def _script(folder: Path, runs_file: Path, layouts: list[tuple[int, int]]) -> str:
    return SCRIPT.format(runs_file=str(runs_file), model=str(folder), layouts=layouts, prompts=PROMPTS,
                         max_tokens=MAX_TOKENS)


def _run(command: list[str], cwd: Path, stdin: str | None = None) -> subprocess.CompletedProcess:
    # The test session's environment (PYTHONPATH included) is the user's: the child finds `shared`.
    return subprocess.run(command, cwd=cwd, input=stdin, capture_output=True, text=True, timeout=SCRIPT_TIMEOUT_S)


def _check(result: subprocess.CompletedProcess, runs_file: Path, layouts: list[tuple[int, int]],
           expected: list[list[int]]) -> None:
    assert result.returncode == 0, result.stderr[-4000:]
    tokens = json.loads(result.stdout.strip().splitlines()[-1])
    assert tokens == {f"tp={tp} pp={pp}": expected for tp, pp in layouts}
    assert len(runs_file.read_text().split()) == 1, "the script's top level ran more than once"
    assert "resource_tracker" not in result.stderr, result.stderr[-4000:]


def test_script_file_without_main_guard_runs_tensor_and_pipeline_parallel_workers(
        tiny_llama_folder, single_process_tokens, tmp_path):
    layouts = [(2, 1), (1, 2)]
    runs_file = tmp_path / "runs.txt"
    script = tmp_path / "generate.py"
    script.write_text(_script(tiny_llama_folder, runs_file, layouts))
    _check(_run([sys.executable, str(script)], tmp_path), runs_file, layouts, single_process_tokens)


def test_script_on_stdin_runs_parallel_workers(tiny_llama_folder, single_process_tokens, tmp_path):
    layouts = [(2, 1)]
    runs_file = tmp_path / "runs.txt"
    result = _run([sys.executable, "-"], tmp_path, stdin=_script(tiny_llama_folder, runs_file, layouts))
    _check(result, runs_file, layouts, single_process_tokens)
