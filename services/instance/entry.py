"""Process entry shared by `python -m services.prefill` and `python -m services.decode`.

Parses flags (and PDSERVE_* variables), configures logging, runs the instance until SIGTERM
or SIGINT, then shuts down gracefully (see InstanceRuntime.stop) and returns the exit code.
"""

import asyncio
import logging
import signal
from collections.abc import Callable, Sequence

from shared.logging_setup import configure_logging as configure_log_output
from shared.errors import ConfigurationError
from shared.tracing import shutdown_tracing
from shared.kv_transfer.ucx.lifecycle import reset_ucx
from services.instance.flags import flag_name, parse_settings
from services.instance.role import RoleHandlers
from services.instance.runtime import InstanceRuntime, new_instance_id
from services.instance.settings import InstanceSettings
from services.observability.tracing_setup import start_tracing

logger = logging.getLogger(__name__)

BuildHandlers = Callable[[InstanceRuntime], RoleHandlers]


def run_instance(prog: str, roles: Sequence[str], build_handlers: BuildHandlers,
                 argv: Sequence[str] | None = None) -> int:
    """0 after a clean shutdown, 1 if the instance failed, 2 for a bad setting (argparse's code),
    met while parsing or while starting (a taken port, an unreadable certificate, a bad model)."""
    try:
        settings = parse_settings(prog, roles, argv)
    except SystemExit as exit_request:  # --help or a bad flag; argparse printed why
        return exit_request.code if isinstance(exit_request.code, int) else 2
    settings = settings.model_copy(update={"instance_id": settings.instance_id or new_instance_id(settings.role)})
    configure_logging(settings)
    try:
        start_tracing(settings, settings.role, settings.instance_id)
        asyncio.run(serve_until_signalled(settings, build_handlers))
    except ConfigurationError as error:
        logger.error("%s instance cannot start: %s: %s", settings.role, flag_name(error.field), error.message)
        return 2
    except Exception:  # noqa: BLE001 - reported, then a non-zero exit
        logger.exception("%s instance failed", settings.role)
        return 1
    finally:
        shutdown_tracing()
        reset_ucx()
    return 0


def configure_logging(settings: InstanceSettings) -> None:
    """--log-format text or json; every line names the role and the instance id."""
    configure_log_output(settings.log_level, settings.log_format,
                         {"role": settings.role, "instance_id": settings.instance_id})


async def serve_until_signalled(settings: InstanceSettings, build_handlers: BuildHandlers) -> None:
    stop_requested = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signal_number in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signal_number, stop_requested.set)
    runtime = InstanceRuntime(settings, build_handlers)
    try:
        await runtime.start()
        await _first_of(stop_requested.wait(), runtime.failed.wait())
        if runtime.failed.is_set():
            raise EngineFailedError(f"the engine of {settings.role} {settings.instance_id} failed")
        logger.info("stop requested: draining")
    finally:
        await runtime.stop()


class EngineFailedError(RuntimeError):
    """The engine failed as a whole; the process exits non-zero to be restarted."""


async def _first_of(*awaitables) -> None:
    tasks = [asyncio.ensure_future(awaitable) for awaitable in awaitables]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
