"""An engine-core process whose service died before the core asked for its parent-death signal
(the service killed while starting: the core was still importing) exits instead of loading the
model for nobody."""

import os
import subprocess
import sys

from shared.executor.python_child import PARENT_PID_VARIABLE, child_environment, is_orphaned


def test_a_child_knows_whether_the_process_that_started_it_is_its_parent(monkeypatch):
    monkeypatch.setenv(PARENT_PID_VARIABLE, str(os.getppid()))
    assert not is_orphaned()
    monkeypatch.setenv(PARENT_PID_VARIABLE, str(os.getpid()))  # not our parent: we were re-parented
    assert is_orphaned()
    monkeypatch.delenv(PARENT_PID_VARIABLE)
    assert not is_orphaned()  # started by something else: nothing to check


def test_child_environment_names_the_starting_process():
    assert child_environment()[PARENT_PID_VARIABLE] == str(os.getpid())


def test_an_orphaned_engine_core_exits_before_reading_its_startup():
    env = child_environment()
    env[PARENT_PID_VARIABLE] = str(os.getpid() + 1_000_000)  # a parent that is not its parent
    done = subprocess.run([sys.executable, "-m", "shared.engine.core_process.main"], env=env,
                          stdin=subprocess.PIPE, capture_output=True, timeout=300)
    assert done.returncode == 3, done.stderr.decode()
    assert b"is gone" in done.stderr
