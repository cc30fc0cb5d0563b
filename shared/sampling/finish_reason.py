"""Why a completion ended: the engine's own enum, re-exported by the API (shared.engine_api.outputs),
mapped onto generation.proto's FinishReason by shared.wire.outputs."""

import enum


class FinishReason(enum.StrEnum):
    """Why a completion ended; the same four on the wire (generation.proto's FinishReason, where
    ERROR never travels: a failed request is an error status) and in the OpenAI API's strings."""
    STOP = "stop"  # EOS, a stop string or stop token, or a guided grammar that terminated
    LENGTH = "length"  # max_tokens or the model's context
    ABORT = "abort"  # cancelled: the client went away, a deadline, a drain, a refused guided token
    ERROR = "error"  # computing this request failed; the engine carries on
