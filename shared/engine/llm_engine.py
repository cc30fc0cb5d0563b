"""The engine's step API in one thread: the engine core plus the output processor.

`LLMEngine` tokenizes, hands token ids to the `EngineCore` (scheduler + executor), and turns
the core's token-level outputs into `RequestOutput`s (text, stop strings, n > 1 groups) with
the `OutputProcessor`, the same pieces the engine-core process splits across two processes.
Services drive it from one thread; the offline `LLM` wraps it in a loop. No transport code.
"""

import logging

from shared.config import EngineConfig
from shared.core.request import Request, RequestStatus
from shared.engine.core_outputs import EngineCoreOutput
from shared.engine.engine_core import EngineCore
from shared.engine.output_processor import OutputProcessor
from shared.engine_api.client import CachedSend, KVReservation, ReservationEvent
from shared.engine_api.errors import CapacityError
from shared.engine_api.outputs import RequestOutput, SampledLogprobs
from shared.errors import InvalidRequestError
from shared.executor.base import Executor
from shared.kv_transfer.types import KVSendParams
from shared.lora.request import LoRARequest
from shared.model.config import ModelConfig
from shared.sampling.params import SamplingParams

__all__ = ["CapacityError", "LLMEngine"]

logger = logging.getLogger(__name__)


class LLMEngine:
    def __init__(self, config: EngineConfig, model_config: ModelConfig, executor: Executor,
                 tokenizer=None, model_key: str = ""):
        self.core = EngineCore(config, model_config, executor, tokenizer, model_key)
        self.tokenizer = tokenizer
        self.output_processor = OutputProcessor(tokenizer)

    @classmethod
    def from_config(cls, config: EngineConfig) -> "LLMEngine":
        from shared.engine.loading import build_engine_parts
        return cls(config, *build_engine_parts(config))

    def shutdown(self) -> None:
        """Release the KV connector and the executor (stops worker processes, if any)."""
        self.core.shutdown()

    # ---- requests ------------------------------------------------------------------------

    def tokenize(self, prompt: str | list[int]) -> list[int]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise InvalidRequestError("prompt", "text prompts need a tokenizer; pass token ids")
            from shared.tokenization.tokenizer import encode_prompt
            return encode_prompt(self.tokenizer, prompt)
        return list(prompt)

    def add_request(self, prompt: str | list[int], params: SamplingParams | None = None,
                    request_id: str | None = None, cache_salt: str | None = None,
                    num_resumed_output_tokens: int = 0, kv_send: KVSendParams | None = None,
                    lora_request: LoRARequest | None = None) -> str:
        """Validate and queue a request; returns its id. Raises InvalidRequestError.

        With `kv_send` (prefill role) the KV connector ships the prompt's KV once the request
        finished, its blocks kept until then; the final output comes after the send and says
        what moved (`kv_transfer`) or why not (`kv_transfer_error`). With
        `num_resumed_output_tokens` (migration) the prompt's last tokens are outputs generated
        elsewhere already: they count toward max_tokens, min_tokens and penalties, advance the
        grammar and the seeded generator, and are not emitted again. With `lora_request` it runs
        with that LoRA adapter (the engine needs enable_lora)."""
        request_id = request_id if request_id is not None else self.core.new_request_id()
        params = params or SamplingParams()
        token_ids = self._checked_tokens(prompt, params)
        self.core.add_request(request_id, token_ids, params, cache_salt, num_resumed_output_tokens, kv_send,
                              lora_request)
        self.output_processor.add_group(request_id, token_ids, params, num_resumed_output_tokens)
        return request_id

    def _checked_tokens(self, prompt: str | list[int], params: SamplingParams) -> list[int]:
        token_ids = self.tokenize(prompt)
        if params.stop and self.tokenizer is None:
            raise InvalidRequestError("stop", "stop strings need a tokenizer")
        return token_ids

    def abort_request(self, request_id: str) -> RequestOutput | None:
        """Stop a request and free its blocks at once; returns its final output, if it was live.
        A request whose KV is being sent has no output left to give: the send is abandoned and
        its blocks are freed when the connector reports it ended."""
        if not self.core.abort_request(request_id):
            return None
        return self.output_processor.abort_group(request_id)

    def has_unfinished_requests(self) -> bool:
        return self.core.has_unfinished_requests()

    def requests_of(self, request_id: str) -> list[Request]:
        """The engine requests (one per completion of n) behind a request id; [] once it ended."""
        return self.core.requests_of(request_id)

    # ---- disaggregation: the KV connector ships prompts' KV and receives it ------------------

    def reserve_request(self, prompt_token_ids: list[int], params: SamplingParams, request_id: str,
                        cache_salt: str | None = None, num_resumed_output_tokens: int = 0,
                        lora_request: LoRARequest | None = None, lease_s: float | None = None) -> KVReservation:
        """Decode role: allocate blocks for a prompt whose KV arrives through the connector
        (its last `num_resumed_output_tokens` generated elsewhere already: see add_request),
        held until `lease_s` from now unless renewed (None: until released). Raises
        CapacityError when there is no room (the caller tries another instance)."""
        token_ids = self._checked_tokens(list(prompt_token_ids), params)
        reservation = self.core.reserve_request(token_ids, params, request_id, cache_salt, num_resumed_output_tokens,
                                                lora_request, lease_s)
        self.output_processor.add_group(request_id, token_ids, params, num_resumed_output_tokens)
        return reservation

    def start_reserved(self, request_id: str, first_token_id: int,
                       first_logprobs: SampledLogprobs | None = None) -> list[RequestOutput]:
        """Decode role: the prompt's KV arrived into the reserved blocks; start decoding after
        the producer's first token."""
        return self._process(self.core.start_reserved(request_id, first_token_id, first_logprobs))

    def prefill_reserved(self, request_id: str) -> list[RequestOutput]:
        """Decode role: compute the reservation's prompt here instead of receiving its KV, then
        decode it (its outputs come from the steps)."""
        self.core.prefill_reserved(request_id)
        return []

    def release_reserved(self, request_id: str, keep_arrived: bool = False) -> bool:
        """Decode role: free a reservation that will not be decoded; False if there is none.
        With `keep_arrived` (a peer pull), KV that arrived joins the prefix cache first."""
        if not self.core.release_reserved(request_id, keep_arrived):
            return False
        self.output_processor.abort_group(request_id)
        return True

    def send_cached(self, send: CachedSend) -> int:
        """Holder of a peer pull: send the prefix's blocks it holds (shared.engine.peer_sends)."""
        return self.core.send_cached(send)

    def drain_reservation_events(self) -> list[ReservationEvent]:
        """What happened to reservations since the last call (see EngineCore)."""
        return self.core.drain_reservation_events()

    # ---- one step ------------------------------------------------------------------------

    def step(self, wait_for_sends: bool = True) -> list[RequestOutput]:
        """One engine step. A request whose own computation fails (guided mask, sampling,
        logprobs, speculation, output processing) finishes alone with finish reason "error";
        only a failure of the step as a whole (the forward pass) raises. Transfers the KV
        connector finished are applied first. A prompt whose KV the step started sending
        gives an unfinished output with its first token, then (`wait_for_sends`: from
        `finish_step_sends`, within the connector's send wait) its final output; a caller
        that streams passes False and hands the first tokens out before calling
        `finish_step_sends` itself."""
        outputs = self._process(self.core.step())
        return outputs + self.finish_step_sends() if wait_for_sends else outputs

    def finish_step_sends(self) -> list[RequestOutput]:
        """Final outputs of the sends the last step started that end within the send wait."""
        return self._process(self.core.finish_step_sends())

    def _process(self, core_outputs: list[EngineCoreOutput]) -> list[RequestOutput]:
        processed = self.output_processor.process(core_outputs)
        self.core.finish_requests(processed.stopped_ids, RequestStatus.FINISHED_STOPPED)
        for child_id, error in processed.failed.items():
            self.core.finish_requests([child_id], RequestStatus.FINISHED_ERROR, error)
        return processed.request_outputs
