"""Bounds on a guided-decoding constraint, checked before XGrammar sees it.

Compiling is the one per-request cost that grows without bound with the input (a schema
with thousands of properties, or nested hundreds of levels, took minutes). These checks are
linear in the text and run at admission; `GuidedDecoding` then compiles off the engine's
step loop under `compile_timeout_s`.
"""

from dataclasses import dataclass

from shared.errors import InvalidRequestError
from shared.guided.params import GuidedDecodingParams

_OPENERS = "([{"
_CLOSERS = ")]}"


@dataclass
class GuidedLimits:
    # Longest schema, regex, grammar or choice list (as JSON text), in UTF-8 bytes.
    max_bytes: int = 64 * 1024
    # Deepest nesting of brackets (JSON objects and arrays, regex groups, grammar groups).
    max_nesting_depth: int = 64
    # Longest a compilation may take before the request is refused (it runs off the step loop).
    compile_timeout_s: float = 10.0
    # Compiled grammars kept, least recently used dropped first.
    max_cached_grammars: int = 256
    # Threads compiling grammars (off the engine's step loop).
    num_compile_threads: int = 2


def check_guided_limits(guided: GuidedDecodingParams, limits: GuidedLimits) -> None:
    """Raise InvalidRequestError naming the field when the constraint is too big or too deep."""
    text = guided.text
    num_bytes = len(text.encode("utf-8", errors="surrogatepass"))
    if num_bytes > limits.max_bytes:
        raise InvalidRequestError(guided.field_name, f"is {num_bytes} bytes; the limit is {limits.max_bytes}")
    depth = nesting_depth(text, skip_quoted=guided.kind in ("json_schema", "choice"))
    if depth > limits.max_nesting_depth:
        raise InvalidRequestError(guided.field_name,
                                  f"nests {depth} levels deep; the limit is {limits.max_nesting_depth}")


def nesting_depth(text: str, skip_quoted: bool) -> int:
    """The deepest bracket nesting in `text`; backslash-escaped brackets do not count, nor,
    with `skip_quoted`, brackets inside double-quoted JSON strings."""
    depth = max_depth = 0
    is_escaped = is_quoted = False
    for char in text:
        if is_escaped:
            is_escaped = False
        elif char == "\\":
            is_escaped = True
        elif skip_quoted and char == '"':
            is_quoted = not is_quoted
        elif is_quoted:
            continue
        elif char in _OPENERS:
            depth += 1
            max_depth = max(max_depth, depth)
        elif char in _CLOSERS:
            depth = max(0, depth - 1)
    return max_depth
