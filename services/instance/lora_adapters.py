"""The LoRA adapters an instance serves, by name: from --lora-modules and loaded at run time.

Each adapter gets a `LoRARequest` with an id never used before in this process (an adapter
unloaded and loaded again, even from the same folder, gets a new one, so the engine never
confuses two versions), and a key (its name and a digest of its files) that the instance
registers in Redis: the gateway hashes prompts for that adapter with it, routes the request
only to instances that registered it, and sends the key with Reserve and Prefill; an
instance whose key for the name differs (other files) refuses with FAILED_PRECONDITION.
"""

import itertools
import logging
from pathlib import Path

import grpc

from shared.errors import InvalidRequestError
from shared.lora.config import LoRAConfig
from shared.lora.peft_format import inspect_adapter
from shared.lora.registry import adapter_hash_key
from shared.lora.request import LoRARequest, validate_adapter_name
from shared.pb.pdserve.v1 import instance_pb2 as pb

from services.rpc.errors import ServiceError

logger = logging.getLogger(__name__)


class AdapterTable:
    def __init__(self, config: LoRAConfig):
        self.config = config
        self._served: dict[str, tuple[LoRARequest, str]] = {}  # name -> (request, key)
        self._ids = itertools.count(1)

    def load(self, name: str, path: str) -> str:
        """Serve the peft folder at `path` as `name`; returns its key. InvalidRequestError when
        LoRA is off, the name is taken or bad, or the folder is not an adapter this engine takes."""
        validate_adapter_name(name)
        if not self.config.enable_lora:
            raise InvalidRequestError("lora_name", "this instance serves no LoRA adapters (start it with "
                                                   "--enable-lora or --lora-modules)")
        if name in self._served:
            raise InvalidRequestError("lora_name", f"adapter {name!r} is already loaded")
        folder = str(Path(path).expanduser().resolve())
        try:
            info = inspect_adapter(folder)
        except InvalidRequestError as error:
            raise InvalidRequestError("lora_path", error.message) from None
        if info.rank > self.config.max_lora_rank:
            raise InvalidRequestError("lora_path", f"adapter {name!r} has rank {info.rank}, above "
                                                   f"max_lora_rank={self.config.max_lora_rank}")
        request = LoRARequest(name, next(self._ids), folder)
        key = adapter_hash_key(request, info)
        self._served[name] = (request, key)
        logger.info("serving LoRA adapter %s (rank %d) from %s", name, info.rank, folder)
        return key

    def unload(self, name: str) -> None:
        """Stop serving `name`; NOT_FOUND when it is not served."""
        if self._served.pop(name, None) is None:
            raise ServiceError(grpc.StatusCode.NOT_FOUND, f"lora_name: adapter {name!r} is not loaded here")
        logger.info("unloaded LoRA adapter %s", name)

    def registered(self) -> dict[str, str]:
        """name -> key of every adapter served (what the instance registers)."""
        return {name: key for name, (_, key) in self._served.items()}

    def resolve(self, request) -> LoRARequest | None:
        """The adapter a Prefill, Reserve or Generate request names (None: the base model);
        NOT_FOUND when not served here, FAILED_PRECONDITION when served from other files."""
        if not request.HasField("lora_adapter"):
            return None
        ref: pb.LoRAAdapterRef = request.lora_adapter
        served = self._served.get(ref.name)
        if served is None:
            raise ServiceError(grpc.StatusCode.NOT_FOUND, f"lora_adapter: {ref.name!r} is not served here")
        if ref.key and ref.key != served[1]:
            raise ServiceError(grpc.StatusCode.FAILED_PRECONDITION,
                               f"lora_adapter: {ref.name!r} is served here from other files (key {served[1]}, "
                               f"the request's {ref.key})")
        return served[0]
