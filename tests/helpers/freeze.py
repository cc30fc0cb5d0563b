"""Freezing instances for tests (SIGSTOP of a process tree): benchmarks.freeze, shared with
`make bench-faults`."""

from benchmarks.freeze import Frozen, process_tree

__all__ = ["Frozen", "process_tree"]
