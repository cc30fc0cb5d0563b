"""Imports ucxx after giving UCX our default environment; every ucxx user imports it from here.

UCX reads its configuration from the environment when the first ucxx context is created, so
defaults must be in place before that. Defaults only fill in what the operator has not set:
  UCX_TLS=tcp,self               TCP between processes (set-up always needs tcp); add `sm` for
                                 shared memory between same-host processes, e.g. "sm,self,tcp".
  UCX_WARN_UNUSED_ENV_VARS=n     no warning about UCX_* variables this UCX build ignores.
"""

import os

DEFAULT_UCX_ENV = {"UCX_TLS": "tcp,self", "UCX_WARN_UNUSED_ENV_VARS": "n"}


def apply_default_ucx_env() -> None:
    """Set each DEFAULT_UCX_ENV variable that is not already set."""
    for name, value in DEFAULT_UCX_ENV.items():
        os.environ.setdefault(name, value)


apply_default_ucx_env()

import ucxx  # noqa: E402  (must follow the environment defaults above)

__all__ = ["DEFAULT_UCX_ENV", "apply_default_ucx_env", "ucxx"]
