"""The prefill role: `python -m services.prefill [flags]` (see services.instance.settings).

Serves Prefill and StreamPrefill (compute the prompt's KV, sample the first token, push the
KV blocks to the decode instance over UCX; the stream sends the first token before the KV has
landed) and GetStatus.
"""

from collections.abc import Sequence

PROG = "python -m services.prefill"


def build_handlers(runtime):
    from services.instance.role import RoleHandlers
    from services.prefill.handler import PrefillHandler
    return RoleHandlers(prefill=PrefillHandler(runtime))


def main(argv: Sequence[str] | None = None) -> int:
    from services.instance.entry import run_instance
    return run_instance(PROG, ("prefill",), build_handlers, argv)
