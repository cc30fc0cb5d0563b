"""Rounding a matmul's row count up to a few buckets, so oneDNN's shape-keyed caches stay small.

oneDNN (its primitive cache) and ideep (its LRU cache) keep one compiled primitive, ~0.3 MB
each, per distinct input shape of every packed bf16 linear layer. A prefill instance sees a
new row count (tokens in the step) on nearly every step, so without buckets those caches fill
up to their capacities (1,024 entries each by default) and, interleaved with the step's
temporaries, fragment the heap: measured here, +0.6 MB in use and ~1 MB more heap per new row
count on one layer shape. Padding the rows to a bucket (zeros, sliced off afterwards) bounds
the distinct shapes to ~50 per layer shape, at a cost of at most 7 rows below 128, 63 rows up
to 2,048 and 255 above.
"""

import torch
import torch.nn.functional as F

BUCKET_STEPS = ((128, 8), (2048, 64))  # (up to this many rows, round up to a multiple of this)
LARGE_STEP = 256
is_enabled = True  # benchmarks switch it off to measure the cost


def bucketed_rows(num_rows: int) -> int:
    """The bucket a row count belongs to (>= num_rows)."""
    step = next((step for limit, step in BUCKET_STEPS if num_rows <= limit), LARGE_STEP)
    return -(-num_rows // step) * step


def pad_rows(x: torch.Tensor) -> torch.Tensor:
    """`x` (rows, features) with zero rows appended up to its bucket (`x` itself if already
    there, or if `x` is not 2-D)."""
    extra = bucketed_rows(x.shape[0]) - x.shape[0] if is_enabled and x.dim() == 2 else 0
    return F.pad(x, (0, 0, 0, extra)) if extra else x
