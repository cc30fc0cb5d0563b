"""Starting a child Python process on one of our modules (`python -m shared...`).

Children are fresh interpreters that never import the user's `__main__`: the engine-core
process and the tensor/pipeline-parallel workers start this way, so `LLM(...)` works in a plain
script without `if __name__ == "__main__":` (multiprocessing's spawn would re-run the script in
every child). What a child needs travels as typed bytes on its stdin, never pickled.
"""

import os
import sys
from pathlib import Path

# The folder that holds the `shared` package: the child imports the same code as its parent.
CODE_ROOT = str(Path(__file__).resolve().parents[2])


def child_environment() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [CODE_ROOT, env.get("PYTHONPATH")]))
    return env


def module_command(module: str) -> list[str]:
    """The command line that runs `module` as a program in this interpreter."""
    return [sys.executable, "-m", module]
