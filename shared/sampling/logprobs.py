"""Log-probabilities reported back to users, from the model's raw distribution.

Called by `Sampler` with the logits exactly as the model produced them (before penalties,
temperature or truncation), as vLLM reports by default.
"""

from collections.abc import Sequence

import torch


def token_logprobs(logprobs: torch.Tensor, token_ids: torch.Tensor) -> list[float]:
    """The logprob of `token_ids[i]` in row i of the (num_rows, vocab) `logprobs`."""
    return logprobs.gather(1, token_ids[:, None]).squeeze(1).tolist()


def top_logprobs(logprobs: torch.Tensor,
                 nums_top: Sequence[int]) -> list[list[tuple[int, float]]]:
    """Per row, its `nums_top[i]` most likely (token id, logprob), most likely first."""
    max_top = max(nums_top, default=0)
    if max_top == 0:
        return [[] for _ in nums_top]
    values, ids = logprobs.topk(max_top, dim=-1)
    id_rows, value_rows = ids.tolist(), values.tolist()
    return [list(zip(id_rows[row][:num], value_rows[row][:num]))
            for row, num in enumerate(nums_top)]


def sampled_and_top_logprobs(raw_logits: torch.Tensor, sampled_token_ids: torch.Tensor,
                             nums_top: Sequence[int]
                             ) -> tuple[list[float], list[list[tuple[int, float]]]]:
    """The sampled tokens' logprobs and each row's top alternatives, from raw logits."""
    logprobs = torch.log_softmax(raw_logits.float(), dim=-1)
    return token_logprobs(logprobs, sampled_token_ids), top_logprobs(logprobs, nums_top)
