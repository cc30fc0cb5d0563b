"""`LLM(tensor_parallel_size=...)` in a plain script, as a user writes one: no main guard.

A real script file runs in a fresh interpreter (`python generate.py`), with TP=2 and then
PP=2. Parallel workers start as `python -m shared.executor.worker_main`, so they never import
the user's `__main__`: the script's top level runs exactly once (it appends its pid to a file
each time it runs), the fp32 greedy tokens equal the single-process engine's, and no
resource-tracker warning appears (a worker's tracker would unlink the engine's rings at exit).
"""

import json
import subprocess
import sys

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
    with LLM(model={model!r}, dtype="float32", num_blocks=32, tensor_parallel_size=tp,
             pipeline_parallel_size=pp) as llm:
        tokens[f"tp={{tp}} pp={{pp}}"] = [list(output.token_ids) for output in llm.generate({prompts!r}, greedy)]
print(json.dumps(tokens))
"""


@pytest.fixture(scope="module")
def single_process_tokens(tiny_llama_folder):
    llm = LLM(model=str(tiny_llama_folder), **ENGINE)
    greedy = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    return [list(output.token_ids) for output in llm.generate(PROMPTS, greedy)]


def test_script_file_without_main_guard_runs_tensor_and_pipeline_parallel_workers(
        tiny_llama_folder, single_process_tokens, tmp_path):
    layouts = [(2, 1), (1, 2)]
    runs_file = tmp_path / "runs.txt"
    script = tmp_path / "generate.py"
    script.write_text(SCRIPT.format(runs_file=str(runs_file), model=str(tiny_llama_folder), layouts=layouts,
                                    prompts=PROMPTS, max_tokens=MAX_TOKENS))
    # The test session's environment (PYTHONPATH included) is the user's: the script finds `shared`.
    result = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True,
                            timeout=SCRIPT_TIMEOUT_S)
    assert result.returncode == 0, result.stderr[-4000:]
    tokens = json.loads(result.stdout.strip().splitlines()[-1])
    assert tokens == {f"tp={tp} pp={pp}": single_process_tokens for tp, pp in layouts}
    assert len(runs_file.read_text().split()) == 1, "the script's top level ran more than once"
    assert "resource_tracker" not in result.stderr, result.stderr[-4000:]
