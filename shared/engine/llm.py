"""The offline Python API: `LLM().generate(prompts, SamplingParams(...))`."""

from collections.abc import Sequence

from shared.engine.llm_engine import LLMEngine
from shared.engine.stats import KVUsage
from shared.engine_api.outputs import RequestOutput
from shared.engine_args import EngineArgs
from shared.errors import InvalidRequestError
from shared.lora.request import LoRARequest
from shared.sampling.params import SamplingParams

Prompt = str | list[int]


class LLM:
    def __init__(self, model: str | None = None, dtype: str = "bfloat16", **engine_kwargs):
        """`engine_kwargs`: fields of shared.engine_args.EngineArgs (the instance flags' names, with
        _ for -); ConfigurationError naming an unknown or bad one."""
        args = EngineArgs.from_kwargs(model=model, dtype=dtype, **engine_kwargs)
        self.engine = LLMEngine.from_config(args.create_engine_config())

    @classmethod
    def from_engine_args(cls, args: EngineArgs) -> "LLM":
        return cls(**{name: getattr(args, name) for name in EngineArgs.field_names()})

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    def generate(self, prompts: Prompt | Sequence[Prompt],
                 sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
                 lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None) -> list[RequestOutput]:
        """Run every prompt to completion; outputs come back in prompt order. `lora_request`:
        one adapter for every prompt, or one entry per prompt (None: the base model)."""
        prompts = [prompts] if _is_single_prompt(prompts) else list(prompts)
        params = _params_per_prompt(sampling_params, len(prompts))
        adapters = _adapters_per_prompt(lora_request, len(prompts))
        request_ids = []
        try:
            for prompt, p, adapter in zip(prompts, params, adapters):
                request_ids.append(self.engine.add_request(prompt, p, lora_request=adapter))
        except BaseException:
            for request_id in request_ids:
                self.engine.abort_request(request_id)
            raise
        return self._run(request_ids)

    def chat(self, messages: list[dict] | list[list[dict]],
             sampling_params: SamplingParams | Sequence[SamplingParams] | None = None) -> list[RequestOutput]:
        """Apply the model's chat template to each conversation, then generate."""
        from shared.tokenization.chat import apply_chat_template
        conversations = [messages] if messages and isinstance(messages[0], dict) else messages
        prompts = [apply_chat_template(self.tokenizer, conversation) for conversation in conversations]
        return self.generate(prompts, sampling_params)

    def shutdown(self) -> None:
        """Stop the engine's worker processes (tensor/pipeline parallelism); idempotent."""
        self.engine.shutdown()

    def __enter__(self) -> "LLM":
        return self

    def __exit__(self, *exc_info) -> None:
        self.shutdown()

    def kv_usage(self) -> KVUsage:
        return self.engine.core.stats.kv_usage()

    def _run(self, request_ids: list[str]) -> list[RequestOutput]:
        finished: dict[str, RequestOutput] = {}
        try:
            while self.engine.has_unfinished_requests():
                for output in self.engine.step():
                    if output.finished:
                        finished[output.request_id] = output
        finally:
            for request_id in request_ids:
                if request_id not in finished:
                    self.engine.abort_request(request_id)
        return [finished[request_id] for request_id in request_ids]


def _is_single_prompt(prompts) -> bool:
    return isinstance(prompts, str) or (isinstance(prompts, list) and prompts and isinstance(prompts[0], int))


def _adapters_per_prompt(lora_request, num_prompts: int) -> list[LoRARequest | None]:
    if lora_request is None or isinstance(lora_request, LoRARequest):
        return [lora_request] * num_prompts
    adapters = list(lora_request)
    if len(adapters) != num_prompts:
        raise InvalidRequestError("lora_request", f"{len(adapters)} given for {num_prompts} prompts")
    return adapters


def _params_per_prompt(params, num_prompts: int) -> list[SamplingParams]:
    if params is None or isinstance(params, SamplingParams):
        return [params or SamplingParams()] * num_prompts
    params = list(params)
    if len(params) != num_prompts:
        raise InvalidRequestError("sampling_params", f"{len(params)} given for {num_prompts} prompts")
    return params
