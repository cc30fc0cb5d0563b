"""The engine core's side of LoRA: admit a request's adapter, or refuse it with a clear error.

Admission reads the adapter's config and tensor shapes (not its weights), checks them against
the model and the engine's limits, and remembers the result by `lora_int_id`; the model runner
reads the weights when a step first needs them (shared.lora.slots). The adapter's key (its name
and a digest of its files) goes into every block hash of its requests, so no prefix cached
for one adapter, or for the base model, is ever reused for another.
"""

from shared.errors import InvalidRequestError
from shared.lora.config import LoRAConfig
from shared.lora.layers import module_dims
from shared.lora.peft_format import AdapterInfo, inspect_adapter
from shared.lora.request import LoRARequest
from shared.model.config import ModelConfig


class AdapterRegistry:
    def __init__(self, config: LoRAConfig | None, model_config: ModelConfig):
        self.config = config
        self.model_config = model_config
        self._admitted: dict[int, tuple[LoRARequest, AdapterInfo]] = {}

    def admit(self, request: LoRARequest | None) -> str | None:
        """The block-hash key of a request's adapter (None for the base model); raises
        InvalidRequestError naming `lora_request` when this engine cannot serve it."""
        if request is None:
            return None
        if not isinstance(request, LoRARequest):
            raise InvalidRequestError("lora_request", f"must be a LoRARequest, got {type(request).__name__}")
        if self.config is None or not self.config.enable_lora:
            raise InvalidRequestError("lora_request", "this engine serves no LoRA adapters (enable_lora is off)")
        known = self._admitted.get(request.lora_int_id)
        if known is not None:
            if known[0] != request:
                raise InvalidRequestError("lora_request.lora_int_id", f"{request.lora_int_id} already names "
                                                                      f"{known[0].lora_name!r} at {known[0].lora_path}")
            return adapter_hash_key(request, known[1])
        info = inspect_adapter(request.lora_path)
        self._check_fits(request, info)
        self._admitted[request.lora_int_id] = (request, info)
        return adapter_hash_key(request, info)

    def names_of(self, lora_int_ids: list[int]) -> list[str]:
        """The names of those admitted adapters (ids not admitted, or forgotten, are skipped)."""
        return [self._admitted[lora_id][0].lora_name for lora_id in lora_int_ids if lora_id in self._admitted]

    def forget(self, lora_int_id: int) -> None:
        """An adapter was unloaded: its id may name another folder from now on."""
        self._admitted.pop(lora_int_id, None)

    def _check_fits(self, request: LoRARequest, info: AdapterInfo) -> None:
        if info.rank > self.config.max_lora_rank:
            raise InvalidRequestError("lora_request", f"adapter {request.lora_name!r} has rank {info.rank}, "
                                                      f"above max_lora_rank={self.config.max_lora_rank}")
        expected = module_dims(self.model_config)
        for (layer, module), dims in sorted(info.module_dims.items()):
            if layer >= self.model_config.num_layers:
                raise InvalidRequestError("lora_request", f"adapter {request.lora_name!r} adapts layer {layer}; "
                                                          f"the model has {self.model_config.num_layers}")
            if dims != expected[module]:
                raise InvalidRequestError("lora_request", f"adapter {request.lora_name!r}: layer {layer} {module} "
                                                          f"is {dims[0]} -> {dims[1]}, the model's is "
                                                          f"{expected[module][0]} -> {expected[module][1]}")


def adapter_hash_key(request: LoRARequest, info: AdapterInfo) -> str:
    return f"lora:{request.lora_name}:{info.content_key}"
