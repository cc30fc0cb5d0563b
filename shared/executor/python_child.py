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
# The pid of the process that started the child, so the child can tell whether it is orphaned.
PARENT_PID_VARIABLE = "PDSERVE_PARENT_PID"


def child_environment() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [CODE_ROOT, env.get("PYTHONPATH")]))
    env[PARENT_PID_VARIABLE] = str(os.getpid())
    return env


def is_orphaned() -> bool:
    """True when the process that started this child (child_environment) is gone: the child was
    re-parented. A parent-death signal asked for after the parent died is never sent, so a child
    that asks for one late (after its imports) must check this once it has."""
    parent = os.environ.get(PARENT_PID_VARIABLE)
    return parent is not None and parent.isdigit() and os.getppid() != int(parent)


def module_command(module: str) -> list[str]:
    """The command line that runs `module` as a program in this interpreter."""
    return [sys.executable, "-m", module]
