"""The decode and colocated roles: `python -m services.decode [--role decode|colocated] [flags]`.

decode:    Reserve / Decode / Release (KV arrives over UCX from prefill instances), PrefillLocally
           (the prompt computed here: conditional disaggregation), GetStatus.
colocated: the same process also serves Generate and Prefill on its one engine: the same
           backend with a role flag, usable alone or as a prefill/decode peer of others.
"""

from collections.abc import Sequence

PROG = "python -m services.decode"
ROLES = ("decode", "colocated")


def build_handlers(runtime):
    from services.instance.role import RoleHandlers
    from services.decode.generate_handler import GenerateHandler
    from services.decode.handler import DecodeHandler
    if runtime.role == "decode":
        return RoleHandlers(decode=DecodeHandler(runtime))
    from services.prefill.handler import PrefillHandler
    return RoleHandlers(prefill=PrefillHandler(runtime), decode=DecodeHandler(runtime),
                        generate=GenerateHandler(runtime))


def main(argv: Sequence[str] | None = None) -> int:
    from services.instance.entry import run_instance
    return run_instance(PROG, ROLES, build_handlers, argv)
