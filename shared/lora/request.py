"""`LoRARequest`: which adapter a request runs with, as vLLM's offline API names it."""

import re
from dataclasses import dataclass

from shared.errors import InvalidRequestError

# What an adapter may be called when served as a model (the OpenAI `model` field).
ADAPTER_NAME_PATTERN = re.compile(r"[A-Za-z0-9._:/@\-]{1,128}")


def validate_adapter_name(name: object, field: str = "lora_name") -> str:
    if not isinstance(name, str) or not ADAPTER_NAME_PATTERN.fullmatch(name):
        raise InvalidRequestError(field, f"must be 1-128 characters of [A-Za-z0-9._:/@-], got {str(name)[:140]!r}")
    return name


@dataclass(frozen=True)
class LoRARequest:
    """A peft adapter folder (`adapter_config.json` + `adapter_model.safetensors`) under a name.

    `lora_int_id` (>= 1) identifies the adapter inside one engine: two requests with the same
    id use the same loaded weights, so one id must always name one folder."""

    lora_name: str
    lora_int_id: int
    lora_path: str

    def __post_init__(self) -> None:
        if not isinstance(self.lora_name, str) or not self.lora_name:
            raise InvalidRequestError("lora_request.lora_name", f"must be a non-empty string, got {self.lora_name!r}")
        if isinstance(self.lora_int_id, bool) or not isinstance(self.lora_int_id, int) or self.lora_int_id < 1:
            raise InvalidRequestError("lora_request.lora_int_id", f"must be an int >= 1, got {self.lora_int_id!r}")
        if not isinstance(self.lora_path, str) or not self.lora_path:
            raise InvalidRequestError("lora_request.lora_path", f"must be a folder path, got {self.lora_path!r}")
