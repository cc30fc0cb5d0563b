"""Error messages of bounded size that are always valid UTF-8.

Every error a service returns (gRPC status details, OpenAI error bodies, logs of failures)
goes through `bounded`, so a request can never make its own error large (a 1 MB model name
echoed into a 404, an engine message embedding a 10 MB schema overflowing the trailers), and
text holding lone surrogates never breaks the encoder that sends it.
"""

MAX_ERROR_MESSAGE_BYTES = 1024
ELLIPSIS = "... (truncated)"


def bounded(text: str, max_bytes: int = MAX_ERROR_MESSAGE_BYTES) -> str:
    """`text` as valid UTF-8 of at most `max_bytes` bytes (lone surrogates escaped as \\udXXX)."""
    data = text.encode("utf-8", "backslashreplace")
    if len(data) <= max_bytes:
        return data.decode("utf-8")
    cut = data[:max(0, max_bytes - len(ELLIPSIS))].decode("utf-8", "ignore")
    return cut + ELLIPSIS
