"""Errors of the local stack launcher."""


class StackError(RuntimeError):
    """A child failed to start, never became healthy, or died."""


class StackAborted(StackError):
    """A stop was requested (Ctrl-C, SIGTERM) while the stack was starting or running."""
