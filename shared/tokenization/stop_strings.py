"""Stopping generation at user-given stop strings, on streamed text.

The engine owns one `StopStringMatcher` per request that has stop strings and feeds it
every text delta from the detokenizer:

    delta = detokenizer.add_tokens([token_id])
    emit, is_stopped = matcher.push(delta)     # stream `emit`; finish if is_stopped
    ...
    # finishing for another reason (EOS, max_tokens):
    emit, is_stopped = matcher.push(detokenizer.flush())
    emit += matcher.flush()                    # only if not is_stopped

Concatenating every `emit` (and the final flush) gives the client exactly the output
text cut at the first stop string, and no prefix of it is ever taken back.
"""

from shared.errors import InvalidRequestError


class StopStringMatcher:
    """Finds the first stop string in streamed text and holds back what could start one.

    `push(delta)` contract, with T = all text pushed so far:
    - If T contains a stop string, the match is the occurrence that ENDS first in T
      (reading left to right, the first one completed; ties go to the longest, i.e. the
      one starting earliest). `push` returns the not-yet-emitted text up to the match's
      start (or up to its end when `include_stop_str_in_output`) and True; `matched_stop`
      names the stop string. Later pushes return ("", True); later text is dropped.
    - Otherwise it returns all not-yet-emitted text except the longest tail of T that is
      a proper prefix of some stop string (that tail is held back, at most
      len(longest stop string) - 1 characters), and False.
    `flush()` returns the held-back tail once generation ends for another reason.
    An empty `stop` list makes `push` return each delta unchanged.
    """

    def __init__(self, stop: list[str], include_stop_str_in_output: bool = False):
        _validate_stop(stop)
        self._stop_strings = list(stop)
        self._include_stop_str_in_output = include_stop_str_in_output
        self._held_text = ""
        self.matched_stop: str | None = None

    @property
    def is_stopped(self) -> bool:
        """True once a stop string has been found."""
        return self.matched_stop is not None

    def push(self, delta: str) -> tuple[str, bool]:
        """Feed the next text delta; return (text safe to emit now, whether a stop hit)."""
        if self.is_stopped:
            return "", True
        text = self._held_text + delta
        match = self._find_first_match(text)
        if match is not None:
            start, stop_string = match
            self.matched_stop = stop_string
            self._held_text = ""
            end = start + len(stop_string) if self._include_stop_str_in_output else start
            return text[:end], True
        num_held = self._num_chars_to_hold(text)
        self._held_text = text[len(text) - num_held :]
        return text[: len(text) - num_held], False

    def flush(self) -> str:
        """Return (and forget) the held-back tail; "" after a stop string was found."""
        held_text, self._held_text = self._held_text, ""
        return held_text

    def _find_first_match(self, text: str) -> tuple[int, str] | None:
        """(start, stop string) of the occurrence ending first in `text`, or None.

        Emitted text never holds the start of a match (it would have been held back),
        so searching the held tail plus the new delta is enough.
        """
        best: tuple[int, int, str] | None = None  # (end, -length, stop string)
        for stop_string in self._stop_strings:
            start = text.find(stop_string)
            if start < 0:
                continue
            candidate = (start + len(stop_string), -len(stop_string), stop_string)
            if best is None or candidate < best:
                best = candidate
        if best is None:
            return None
        end, _, stop_string = best
        return end - len(stop_string), stop_string

    def _num_chars_to_hold(self, text: str) -> int:
        """Length of the longest tail of `text` that is a proper prefix of a stop string."""
        longest = max((len(s) for s in self._stop_strings), default=0)
        for num_chars in range(min(len(text), longest - 1), 0, -1):
            tail = text[len(text) - num_chars :]
            if any(s.startswith(tail) for s in self._stop_strings):
                return num_chars
        return 0


def _validate_stop(stop: list[str]) -> None:
    """Raise InvalidRequestError('stop', ...) unless `stop` is a list of non-empty strings."""
    if not isinstance(stop, list):
        raise InvalidRequestError("stop", f"must be a list of strings, got {type(stop).__name__}")
    for index, stop_string in enumerate(stop):
        if not isinstance(stop_string, str):
            raise InvalidRequestError("stop", f"item {index} must be a string")
        if not stop_string:
            raise InvalidRequestError("stop", f"item {index} must not be empty")
