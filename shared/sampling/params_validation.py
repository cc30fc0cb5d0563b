"""The range and type checks behind `SamplingParams.validate`.

Each check raises `InvalidRequestError(field, message)` for the first problem it finds, so a
front door can answer "temperature: must be >= 0, got -1" without knowing the rules.
"""

import math
from typing import TYPE_CHECKING

from shared.errors import InvalidRequestError
from shared.guided.params import GuidedDecodingParams

if TYPE_CHECKING:
    from shared.sampling.params import SamplingParams

# Most top alternatives a request may ask for, per generated or prompt token.
MAX_LOGPROBS = 20
MAX_ABS_PENALTY = 2.0


def validate_sampling_params(params: "SamplingParams", vocab_size: int | None) -> None:
    """Called by `SamplingParams.validate`; `vocab_size` None skips token-id range checks."""
    _check_counts(params)
    _check_distribution_shaping(params)
    _check_penalties(params)
    _check_lengths(params)
    _check_logprobs(params)
    _check_stops(params, vocab_size)
    _check_guided(params)
    if not isinstance(params.use_speculation, bool):
        raise InvalidRequestError("use_speculation", f"must be true or false, got {params.use_speculation!r}")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value))


def _require_int(field: str, value: object) -> None:
    if not _is_int(value):
        raise InvalidRequestError(field, f"must be an integer, got {value!r}")


def _require_number(field: str, value: object) -> None:
    if not _is_number(value):
        raise InvalidRequestError(field, f"must be a finite number, got {value!r}")


def _check_counts(params: "SamplingParams") -> None:
    _require_int("n", params.n)
    if params.n < 1:
        raise InvalidRequestError("n", f"must be >= 1, got {params.n}")
    if params.best_of is not None and params.best_of != params.n:
        raise InvalidRequestError("best_of", "only best_of == n is supported, "
                                  f"got best_of={params.best_of!r}, n={params.n}")
    if params.seed is not None and not _is_int(params.seed):
        raise InvalidRequestError("seed", f"must be an integer or null, got {params.seed!r}")


def _check_distribution_shaping(params: "SamplingParams") -> None:
    _require_number("temperature", params.temperature)
    if params.temperature < 0:
        raise InvalidRequestError("temperature", f"must be >= 0, got {params.temperature}")
    _require_number("top_p", params.top_p)
    if not 0 < params.top_p <= 1:
        raise InvalidRequestError("top_p", f"must be in (0, 1], got {params.top_p}")
    _require_int("top_k", params.top_k)
    if params.top_k < -1:
        raise InvalidRequestError("top_k", f"must be -1, 0 (off) or positive, got {params.top_k}")
    _require_number("min_p", params.min_p)
    if not 0 <= params.min_p <= 1:
        raise InvalidRequestError("min_p", f"must be in [0, 1], got {params.min_p}")


def _check_penalties(params: "SamplingParams") -> None:
    _require_number("repetition_penalty", params.repetition_penalty)
    if params.repetition_penalty <= 0:
        raise InvalidRequestError(
            "repetition_penalty", f"must be > 0, got {params.repetition_penalty}")
    for field in ("presence_penalty", "frequency_penalty"):
        value = getattr(params, field)
        _require_number(field, value)
        if not -MAX_ABS_PENALTY <= value <= MAX_ABS_PENALTY:
            raise InvalidRequestError(field, f"must be in [-2, 2], got {value}")


def _check_lengths(params: "SamplingParams") -> None:
    if params.max_tokens is not None:
        _require_int("max_tokens", params.max_tokens)
        if params.max_tokens < 1:
            raise InvalidRequestError("max_tokens", f"must be >= 1, got {params.max_tokens}")
    _require_int("min_tokens", params.min_tokens)
    if params.min_tokens < 0:
        raise InvalidRequestError("min_tokens", f"must be >= 0, got {params.min_tokens}")
    if params.max_tokens is not None and params.min_tokens > params.max_tokens:
        raise InvalidRequestError(
            "min_tokens",
            f"must be <= max_tokens ({params.max_tokens}), got {params.min_tokens}")


def _check_logprobs(params: "SamplingParams") -> None:
    for field in ("logprobs", "prompt_logprobs"):
        value = getattr(params, field)
        if value is None:
            continue
        _require_int(field, value)
        if not 0 <= value <= MAX_LOGPROBS:
            raise InvalidRequestError(field, f"must be in [0, {MAX_LOGPROBS}], got {value}")


def _check_stops(params: "SamplingParams", vocab_size: int | None) -> None:
    for text in params.stop:
        if not isinstance(text, str):
            raise InvalidRequestError("stop", f"must be strings, got {text!r}")
        if not text:
            raise InvalidRequestError("stop", "must not contain empty strings")
    upper = vocab_size if vocab_size is not None else math.inf
    for token_id in params.stop_token_ids:
        if not _is_int(token_id) or not 0 <= token_id < upper:
            bound = f"[0, {vocab_size})" if vocab_size is not None else "non-negative integers"
            raise InvalidRequestError(
                "stop_token_ids", f"must be token ids in {bound}, got {token_id!r}")


def _check_guided(params: "SamplingParams") -> None:
    if params.guided is None:
        return
    if not isinstance(params.guided, GuidedDecodingParams):
        raise InvalidRequestError(
            "guided", f"must be a GuidedDecodingParams or None, got {type(params.guided).__name__}")
    params.guided.validate()
