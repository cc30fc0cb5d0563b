"""Which requests may speculate. The others decode one token a step, in the same batch.

Not speculated: requests that opted out (`SamplingParams.use_speculation=False`), that want
logprobs (one logprob entry per step and token would need per-position bookkeeping), that are
guided (the grammar's mask depends on every draft token before it), and prefill-role requests
(they only compute the prompt and sample the first token). Penalties, min_tokens, seeds,
stop tokens and strings and n > 1 all work with speculation.
"""

from shared.core.request import Request


def supports_speculation(request: Request) -> bool:
    params = request.sampling_params
    return (params.use_speculation and params.logprobs is None and params.guided is None
            and request.guided_matcher is None and not request.hold_blocks_on_finish)
