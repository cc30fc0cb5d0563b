"""Token-level finish rules, checked after each sampled token (stop strings live with text)."""

from shared.core.request import Request, RequestStatus


def token_stop_status(request: Request, max_model_len: int) -> RequestStatus | None:
    params = request.sampling_params
    token_id = request.output_token_ids[-1]
    if request.num_output_tokens >= params.min_tokens:
        if not params.ignore_eos and token_id in request.eos_token_ids:
            return RequestStatus.FINISHED_STOPPED
        if token_id in params.stop_token_ids:
            request.stop_reason = token_id
            return RequestStatus.FINISHED_STOPPED
    if request.num_output_tokens >= request.max_output_tokens or request.num_tokens >= max_model_len:
        return RequestStatus.FINISHED_LENGTH
    return None
