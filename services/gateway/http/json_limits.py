"""Why a JSON body that is valid JSON still did not parse, naming the field and the limit.

Python's json parser refuses two kinds of valid JSON with errors that name nothing (FastAPI
turns both into "There was an error parsing the body"): an integer with more digits than
`int()` converts (4300 by default, sys.get_int_max_str_digits) and nesting deeper than the
interpreter's recursion limit lets it go (RecursionError). `parse_limit_error(cause, body)`
returns the message for such a failure, e.g. "max_tokens: integer has more than 4300 digits"
or "guided_json: nested deeper than 512 levels", the field found by one scan of the tokens of
the body's first MAX_SCAN_BYTES (the scan's cost is bounded; past them the message names only
the limit); None for any other failure.
"""

import re
import sys

from services.gateway.http.errors import OpenAIError, bad_request

MAX_JSON_DEPTH = 512  # every body nesting at most this deep parses; deeper ones may be refused
MAX_SCAN_BYTES = 1 << 20
# A string, a bracket, or a run of digits that is a whole integer (not part of a float).
_TOKENS = re.compile(rb'"(?:[^"\\]|\\.)*"|[\[\]{}]|(?<![\d.eE+-])-?\d+(?![\d.eE])', re.DOTALL)
_INT_DIGITS_ERROR = "integer string conversion"


def parse_limit_error(cause: BaseException | None, body: bytes | None) -> OpenAIError | None:
    if isinstance(cause, RecursionError):
        field = _field_where(body or b"", _is_too_deep)
        return _named(field, f"nested deeper than {MAX_JSON_DEPTH} levels")
    if isinstance(cause, ValueError) and _INT_DIGITS_ERROR in str(cause):
        field = _field_where(body or b"", _is_too_long_integer)
        return _named(field, f"integer has more than {sys.get_int_max_str_digits()} digits")
    return None


def _named(field: str | None, problem: str) -> OpenAIError:
    if field is None:
        return bad_request(None, f"the request body: {problem}")
    return bad_request(field, f"{field}: {problem}")


def _is_too_deep(token: bytes, depth: int) -> bool:
    return depth > MAX_JSON_DEPTH


def _is_too_long_integer(token: bytes, depth: int) -> bool:
    return token[:1] not in b'"[]{}' and len(token.lstrip(b"-")) > sys.get_int_max_str_digits()


def _field_where(body: bytes, is_it) -> str | None:
    """The top-level key under which the first token for which `is_it(token, depth)` holds
    lies (the body is a JSON object; the last string met at depth 1 is the current key)."""
    depth, key = 0, None
    for match in _TOKENS.finditer(body[:MAX_SCAN_BYTES]):
        token = match.group()
        if token in (b"[", b"{"):
            depth += 1
        elif token in (b"]", b"}"):
            depth -= 1
        elif depth == 1 and token.startswith(b'"'):
            key = token[1:-1].decode("utf-8", "replace")
        if is_it(token, depth):
            return key
    return None
