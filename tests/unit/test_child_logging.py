"""Processes a service starts (the engine core, parallel workers) log the way the service does:
its level, its format (JSON lines in containers) and its context (role, instance id), plus
their own component name; a child of nobody configured logs plain text."""

import json
import os
import subprocess
import sys

from shared.logging_setup.configure import CHILD_LOGGING_ENV_VAR

CHILD = ("import logging; from shared.logging_setup import configure_child_logging; "
         "configure_child_logging('engine-core[7]'); logging.getLogger('shared.child').info('hello'); "
         "logging.getLogger('shared.child').debug('details')")
PARENT = ("import os, subprocess, sys; from shared.logging_setup import configure_logging; "
          "configure_logging('INFO', 'json', {'role': 'decode', 'instance_id': 'decode-x'}); "
          f"sys.exit(subprocess.run([sys.executable, '-c', {CHILD!r}]).returncode)")


def run_python(code: str, env: dict[str, str]) -> str:
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stderr


def test_a_child_logs_json_lines_with_its_parents_context():
    env = {key: value for key, value in os.environ.items() if key != CHILD_LOGGING_ENV_VAR}
    [line] = run_python(PARENT, env).splitlines()
    entry = json.loads(line)
    assert (entry["message"], entry["level"], entry["logger"]) == ("hello", "INFO", "shared.child")
    assert (entry["role"], entry["instance_id"], entry["component"]) == ("decode", "decode-x", "engine-core[7]")


def test_a_child_of_an_unconfigured_parent_logs_text():
    env = {key: value for key, value in os.environ.items() if key != CHILD_LOGGING_ENV_VAR}
    [line] = run_python(CHILD, env).splitlines()
    assert line.endswith("INFO engine-core[7] shared.child: hello")
    garbled = {**env, CHILD_LOGGING_ENV_VAR: "{not json"}
    assert run_python(CHILD, garbled).splitlines()[0].endswith("engine-core[7] shared.child: hello")
