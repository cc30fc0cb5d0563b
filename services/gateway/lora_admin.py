"""Loading and unloading LoRA adapters at run time, on every live instance.

The gateway's `/v1/load_lora_adapter` and `/v1/unload_lora_adapter` (vLLM's names) and its
gRPC LoadLoRAAdapter / UnloadLoRAAdapter, all behind the API key, call the same RPC on every
live instance at once (the adapter's folder must be on each instance's machine). Each instance
registers what it serves; the gateway lists the instances again right after, so the next
request for the adapter is routed by the new registrations. When some instances refuse, the
call fails with the first refusal's status, naming those instances; the others keep what they
did (load again where it failed, or unload).
"""

import asyncio
import logging

import grpc

from shared.errors import InvalidRequestError
from shared.lora.request import validate_adapter_name
from shared.pb.pdserve.v1 import instance_pb2

from services.gateway.errors import GatewayError, invalid_argument
from services.gateway.relay_context import RelayContext

logger = logging.getLogger(__name__)


async def load_adapter_everywhere(relay: RelayContext, name: str, path: str) -> list[str]:
    """Ids of the instances that now serve `name` from `path`."""
    _check(name)
    if not path:
        raise invalid_argument(InvalidRequestError("lora_path", "must name the adapter's folder"))
    request = instance_pb2.LoadLoRAAdapterRequest(lora_name=name, lora_path=path)
    return await _on_every_instance(relay, "LoadLoRAAdapter", request, f"load LoRA adapter {name!r}")


async def unload_adapter_everywhere(relay: RelayContext, name: str) -> list[str]:
    """Ids of the instances that stopped serving `name`; NOT_FOUND when none served it."""
    _check(name)
    listing = await relay.view.live()
    serving = [info for info, _ in listing if info.adapter_key(name) is not None]
    if not serving:
        raise GatewayError(grpc.StatusCode.NOT_FOUND, f"lora_name: no live instance serves the LoRA adapter {name!r}")
    request = instance_pb2.UnloadLoRAAdapterRequest(lora_name=name)
    return await _on_every_instance(relay, "UnloadLoRAAdapter", request, f"unload LoRA adapter {name!r}",
                                    [info.grpc_address for info in serving])


def _check(name: str) -> None:
    try:
        validate_adapter_name(name)
    except InvalidRequestError as error:
        raise invalid_argument(error) from None


async def _on_every_instance(relay: RelayContext, method: str, request, what: str,
                             addresses: list[str] | None = None) -> list[str]:
    listing = await relay.view.live()
    targets = [(info.instance_id, info.grpc_address) for info, _ in listing
               if addresses is None or info.grpc_address in addresses]
    if not targets:
        raise GatewayError(grpc.StatusCode.UNAVAILABLE, f"no live instance to {what} on")
    results = await asyncio.gather(*(getattr(relay.channels.stub(address), method)(
        request, timeout=relay.hang.control_call_s) for _, address in targets), return_exceptions=True)
    relay.view.refresh()
    done = [instance_id for (instance_id, _), result in zip(targets, results) if not isinstance(result, BaseException)]
    failed = [(instance_id, result) for (instance_id, _), result in zip(targets, results)
              if isinstance(result, BaseException)]
    logger.info("%s: done on %s, failed on %s", what, done, [instance_id for instance_id, _ in failed])
    if failed:
        first_id, first = failed[0]
        if not isinstance(first, grpc.aio.AioRpcError):
            raise first
        names = ", ".join(instance_id for instance_id, _ in failed)
        done_text = f" (done on {', '.join(done)})" if done else ""
        if first.code() == grpc.StatusCode.INVALID_ARGUMENT:  # keeps starting with the field's name
            raise GatewayError(first.code(), f"{first.details()} [instances {names}]{done_text}")
        raise GatewayError(first.code(), f"{what} failed on {names}: {first.details()}{done_text}")
    return done
