"""Taking over a request that another instance was generating (migration).

The caller sends the prompt followed by the tokens generated so far and says how many of them
are outputs. The engine request keeps the real prompt, starts with those outputs (so they
count toward max_tokens, min_tokens and penalties, and the seeded generator skips their draws:
shared.executor.model_runner), and has its grammar matcher advanced over them; they are
computed again like a prompt and never emitted again (shared.engine.output_processor).
"""

from shared.core.request import Request
from shared.errors import InvalidRequestError
from shared.sampling.params import SamplingParams


def split_resumed(token_ids: list[int], num_resumed: int,
                  params: SamplingParams) -> tuple[list[int], list[int]]:
    """(prompt, resumed outputs) of a prompt whose last `num_resumed` tokens are outputs."""
    if num_resumed == 0:
        return token_ids, []
    if not 0 < num_resumed < len(token_ids):
        raise InvalidRequestError("num_resumed_output_tokens", f"must be in [0, {len(token_ids)}) "
                                                               f"for {len(token_ids)} tokens, got {num_resumed}")
    if params.n != 1:
        raise InvalidRequestError("num_resumed_output_tokens", "a resumed request has n == 1")
    if params.max_tokens is not None and num_resumed >= params.max_tokens:
        raise InvalidRequestError("num_resumed_output_tokens", f"{num_resumed} tokens leave nothing to "
                                                               f"generate within max_tokens {params.max_tokens}")
    return token_ids[:-num_resumed], token_ids[-num_resumed:]


def resume_request(request: Request, output_token_ids: list[int]) -> None:
    """Give a new request its earlier outputs; its grammar (if any) accepts them first."""
    request.resume_outputs(output_token_ids)
    matcher = request.guided_matcher
    if matcher is None:
        return
    for token_id in output_token_ids:
        if not matcher.accept_token(token_id):
            raise InvalidRequestError("num_resumed_output_tokens", f"resumed token {token_id} breaks the "
                                                                   "request's constraint")
