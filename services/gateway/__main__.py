"""`python -m services.gateway [flags]`: run one gateway until SIGINT or SIGTERM."""

import asyncio
import logging
import signal
import sys
from collections.abc import Sequence

from shared.errors import ConfigurationError
from shared.logging_setup import configure_logging
from shared.logging_setup.process_exit import exit_without_teardown
from shared.tracing import shutdown_tracing

from services.settings.flags import flag_name
from services.observability.tracing_setup import start_tracing
from services.gateway.server import GatewayServer
from services.gateway.settings import GatewaySettings, parse_settings

logger = logging.getLogger("services.gateway")


async def serve(settings: GatewaySettings) -> int:
    """Serve until a signal (exit 0) or until getting ready fails (exit 1)."""
    server = GatewayServer(settings)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    await server.start()
    ready = loop.create_task(server.become_ready())
    ready.add_done_callback(lambda task: task.cancelled() or task.exception() is None or stop.set())
    try:
        await stop.wait()
    finally:
        ready.cancel()
        await asyncio.gather(ready, return_exceptions=True)
        await server.stop(settings.drain_timeout_s)
    if not ready.cancelled() and ready.exception() is not None:
        logger.error("gateway could not get ready: %r", ready.exception())
        return 1
    logger.info("gateway stopped on a signal")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """0 after a signal, 1 if getting ready failed, 2 for a bad setting (named on stderr)."""
    try:
        settings = parse_settings(argv)
        configure_logging(settings.log_level, settings.log_format, {"role": "gateway"})
        start_tracing(settings, "gateway")
        try:
            return asyncio.run(serve(settings))
        finally:
            shutdown_tracing()
    except ConfigurationError as error:
        print(f"gateway: error: {flag_name(error.field)}: {error.message}", file=sys.stderr)
        return 2

if __name__ == "__main__":
    exit_without_teardown(main())  # main() stopped the servers and exported the spans already
