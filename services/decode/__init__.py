"""The decode and colocated roles: `python -m services.decode [--role decode|colocated] [flags]`.

decode:    Reserve / Decode / Release (KV arrives over UCX from prefill instances), PrefillLocally
           (the prompt computed here: conditional disaggregation), GetStatus; with --openai-port,
           Generate too (the OpenAI door's requests that name no usable prefill instance).
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
    if runtime.role == "decode":  # with an OpenAI door, Generate too: its prompts without a named prefill
        return RoleHandlers(decode=DecodeHandler(runtime),
                            generate=GenerateHandler(runtime) if runtime.settings.openai_port != -1 else None)
    from services.prefill.handler import PrefillHandler
    return RoleHandlers(prefill=PrefillHandler(runtime), decode=DecodeHandler(runtime),
                        generate=GenerateHandler(runtime))


def main(argv: Sequence[str] | None = None) -> int:
    from services.instance.entry import run_instance
    return run_instance(PROG, ROLES, build_handlers, argv)
