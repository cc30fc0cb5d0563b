"""Entry point of a tensor/pipeline-parallel worker: `python -m shared.executor.worker_main`.

Reads its `WorkerStartup` from stdin and serves steps until the engine says shut down or is
gone (worker.py). Exit status 0 after a shutdown, 1 when the worker failed (the traceback is on
stderr), 2 when stdin held no startup message. Ctrl-C in a terminal reaches the whole process
group: the engine decides when its workers stop, not the keyboard.
"""

import signal
import sys

from shared.executor.worker import run_worker
from shared.executor.worker_startup import StartupError, decode_startup


def main() -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        startup = decode_startup(sys.stdin.buffer.read())
    except StartupError as error:
        print(f"parallel worker: {error}", file=sys.stderr)
        return 2
    run_worker(startup)  # ends the process with the worker's exit status


if __name__ == "__main__":
    sys.exit(main())
