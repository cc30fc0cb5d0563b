"""What the gateway holds once started: the model, the relay context, the metrics, the limits and
the load shedding, shared by both front doors (gRPC and the OpenAI HTTP API) and by the
instances' own OpenAI door."""

from dataclasses import dataclass, field

import grpc

from services.gateway.admission import Admission
from services.gateway.errors import GatewayError
from services.gateway.limits import RequestLimits
from services.gateway.metrics import GatewayMetrics
from services.gateway.relay_context import RelayContext
from services.gateway.served_model import ServedModel


@dataclass
class GatewayState:
    """Filled in once the model is loaded and the cluster view built."""

    default_deadline_s: float
    model: ServedModel | None = None
    relay: RelayContext | None = None
    metrics: GatewayMetrics | None = None  # set by GatewayServer
    limits: RequestLimits = RequestLimits()
    # LoRA adapters the gateway was told of (--lora-modules), served by instances or not yet.
    lora_modules: tuple[str, ...] = ()
    admission: Admission = field(default_factory=Admission)  # load shedding


def require_ready(state: GatewayState) -> tuple[ServedModel, RelayContext]:
    """The model and relay context; UNAVAILABLE while the gateway is still starting."""
    if state.model is None or state.relay is None:
        raise GatewayError(grpc.StatusCode.UNAVAILABLE, "the gateway is starting; retry shortly")
    return state.model, state.relay
