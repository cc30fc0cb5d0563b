"""Per-request fault isolation for batched work: one bad row must not fail the batch.

`run_isolated(items, work, failed)` runs `work(items)` once for the whole batch; if it raises,
it reruns `work([item])` for each item alone, so the rows that fail on their own are found
(and recorded in `failed` as request id -> message) while every other row still gets its
result. `work` returns a dict keyed by request id. A failure that every row hits alone is
still per row: the engine finishes those requests with an error and keeps serving.
"""

import logging
from collections.abc import Callable, Sequence
from typing import TypeVar

logger = logging.getLogger(__name__)

# Longest error text handed to a client (messages may embed user input).
MAX_ERROR_CHARS = 500

Result = TypeVar("Result")


def describe_error(error: BaseException) -> str:
    """A bounded one-line description of `error` for the client."""
    text = f"{type(error).__name__}: {error}".replace("\n", " ")
    return text if len(text) <= MAX_ERROR_CHARS else text[:MAX_ERROR_CHARS - 3] + "..."


def run_isolated(items: Sequence, work: Callable[[list], dict[str, Result]], failed: dict[str, str],
                 what: str, before_retry: Callable[[], None] | None = None) -> dict[str, Result]:
    """`work(items)`, or on failure the merged results of `work([item])` per item; items that
    fail alone are left out of the result and recorded in `failed`. `before_retry` runs once
    before the per-item retries (e.g. to rewind random generators the batch consumed)."""
    if not items:
        return {}
    try:
        return work(list(items))
    except Exception:  # noqa: BLE001 - find the rows to blame below
        logger.warning("%s failed for a batch of %d; retrying each request alone", what, len(items))
    if before_retry is not None:
        before_retry()
    results: dict[str, Result] = {}
    for item in items:
        try:
            results.update(work([item]))
        except Exception as error:  # noqa: BLE001 - this request alone fails
            logger.exception("%s failed for request %s", what, item.request_id)
            failed[item.request_id] = f"{what} failed: {describe_error(error)}"
    return results
