"""One step's token bitmask: filled from the guided requests' matchers, applied to their logits.

Layout (XGrammar's): int32 words, ceil(vocab / 32) per row; bit t % 32 of word t // 32 set
means token t is allowed. `GuidedDecoding.prepare_step` fills one tensor for all the step's
constrained rows (`fill_bitmask`); the sampler masks those rows with one call
(`apply_token_bitmasks`) after penalties and before choosing tokens. `allows_only` tells
min_tokens suppression (`shared.sampling.penalties`) that a row's grammar is complete.
"""

from collections.abc import Sequence

import numpy as np
import torch

BITS_PER_WORD = 32


def num_bitmask_words(vocab_size: int) -> int:
    return (vocab_size + BITS_PER_WORD - 1) // BITS_PER_WORD


def fill_bitmask(matchers: Sequence, vocab_size: int) -> tuple[torch.Tensor, list[bool]]:
    """(num_matchers, words) int32 on the CPU, row i from matchers[i], and per row whether it
    restricts anything (False: every token allowed, so the row need not be applied)."""
    import xgrammar as xgr
    bitmask = xgr.allocate_token_bitmask(len(matchers), vocab_size)
    restricts = [matcher.fill_next_token_bitmask(bitmask, row) for row, matcher in enumerate(matchers)]
    return bitmask, restricts


def apply_token_bitmasks(logits: torch.Tensor, row_bitmasks: Sequence[torch.Tensor],
                         row_indices: Sequence[int]) -> None:
    """Set logits[row_indices[i], t] to -inf, in place, for every token t that
    row_bitmasks[i] forbids. The other rows are not touched.

    On the CPU the bits are unpacked once for all rows (numpy) and each row goes through one
    branch-free select: under 1 ns per vocabulary entry whatever the mask, where XGrammar's
    CPU kernel costs ~4 ns per forbidden token (and JSON structure forbids nearly all).
    Elsewhere XGrammar's device kernel (Triton on CUDA) does it."""
    stacked = torch.stack(list(row_bitmasks))
    if logits.device.type == "cpu":
        forbidden = forbidden_tokens(stacked, logits.shape[1])
        minus_inf = torch.tensor(float("-inf"), dtype=logits.dtype)
        for index, row in enumerate(row_indices):
            torch.where(forbidden[index], minus_inf, logits[row], out=logits[row])
        return
    import xgrammar as xgr
    num_rows, vocab_size = logits.shape
    batch_bitmask = torch.full((num_rows, num_bitmask_words(vocab_size)), -1, dtype=torch.int32)
    batch_bitmask[list(row_indices)] = stacked
    xgr.apply_token_bitmask_inplace(logits, batch_bitmask.to(logits.device, non_blocking=True),
                                    vocab_size=vocab_size, indices=list(row_indices))


def forbidden_tokens(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """(rows, vocab_size) bool, True where the bit is clear; `bitmask` (rows, words) int32."""
    little_endian_bytes = bitmask.numpy().astype("<i4", copy=False).view(np.uint8)
    bits_clear = np.unpackbits(~little_endian_bytes, axis=-1, bitorder="little")[:, :vocab_size]
    return torch.from_numpy(bits_clear).view(torch.bool)


def allows_only(row_bitmask: torch.Tensor, token_ids: Sequence[int]) -> bool:
    """True when every token the row allows is one of `token_ids`: with the EOS ids, the
    grammar is complete (the sampler then lets EOS through despite min_tokens). XGrammar
    leaves the bits past the vocabulary clear, so whole words can be compared."""
    words = row_bitmask.cpu().numpy().view(np.uint32).copy()
    ids = np.asarray([token_id for token_id in token_ids if token_id < words.size * BITS_PER_WORD],
                     dtype=np.int64)
    np.bitwise_and.at(words, ids // BITS_PER_WORD, ~(np.uint32(1) << (ids % BITS_PER_WORD).astype(np.uint32)))
    return not words.any()


def allowed_token_ids(row_bitmask: torch.Tensor, vocab_size: int) -> list[int]:
    """The token ids a row allows (tests, debugging)."""
    return (~forbidden_tokens(row_bitmask[None], vocab_size)[0]).nonzero().flatten().tolist()


def allows_no_token(row_bitmask: torch.Tensor, vocab_size: int) -> bool:
    """True when the row allows no token of the vocabulary (an unsatisfiable constraint)."""
    return bool(forbidden_tokens(row_bitmask[None], vocab_size)[0].all())
