"""The engine's public API: the offline `LLM`, the step-driven `LLMEngine`, their outputs."""

from shared.engine.llm import LLM
from shared.engine.llm_engine import LLMEngine
from shared.engine_api.outputs import CompletionOutput, RequestOutput
from shared.lora.request import LoRARequest
from shared.sampling.params import SamplingParams

__all__ = ["LLM", "LLMEngine", "LoRARequest", "SamplingParams", "RequestOutput", "CompletionOutput"]
