"""How an instance's OpenAI door generates a request's prompts: the gateway's one generation
path (services.gateway.generation.generate_stream: validation, tokenization, admission, the
relay, counters) over a PodView of the cluster made for the request from its prefill header.

A prompt whose named prefill instance cannot be used is computed here, never refused: the
header was malformed, the endpoint unknown, of another role or not pairable (PodView), or its
prefill failed before the first token (down, refusing, hung past the relay's stall timeout).
Each such fallback is logged with its reason and counted (NamedPrefillCounters, exported as
`pdserve:named_prefills`). Only a failure before the client has any token falls back: after
that the relay's own failover applies, as in the gateway.
"""

import contextlib
import logging
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import replace

from starlette.requests import Request

from shared.pb.pdserve.v1 import gateway_pb2, generation_pb2

from services.gateway.cluster_view import ClusterView
from services.gateway.errors import GatewayError
from services.gateway.generation import generate_stream
from services.gateway.state import GatewayState
from services.gateway.http.flow import merge_tagged
from services.gateway.http.sse import Tagged
from services.gateway.router import Candidate
from services.instance.pod_view import PodView
from services.instance.prefill_header import NamedPrefills, named_prefills

logger = logging.getLogger(__name__)

ROUTED = "routed"  # computed by the named prefill instance (its first token came)
FAILED = "failed"  # ... and failed before the first token: computed here after all
MALFORMED = "malformed"


class NamedPrefillCounters:
    """Prompts by what became of their named prefill endpoint: ROUTED, or a fallback reason."""

    def __init__(self):
        self.outcomes: Counter[str] = Counter()

    def record(self, outcome: str) -> None:
        self.outcomes[outcome] += 1


class PodStreams:
    """The door's StreamOpener (services.gateway.http.flow)."""

    def __init__(self, state: GatewayState, cluster: ClusterView, own: Callable[[], Candidate],
                 counters: NamedPrefillCounters):
        self.state = state  # its relay's view is replaced per request
        self.cluster = cluster
        self.own = own
        self.counters = counters

    def __call__(self, request: Request, messages: list[gateway_pb2.GenerateRequest],
                 is_prompt_only: bool) -> AsyncIterator[Tagged]:
        named = named_prefills(request.headers)
        return merge_tagged([self.prompt_stream(message, named, is_prompt_only) for message in messages])

    async def prompt_stream(self, message: gateway_pb2.GenerateRequest, named: NamedPrefills,
                            is_prompt_only: bool = False) -> AsyncIterator[generation_pb2.GenerateResponse]:
        if named.malformed:
            self._fall_back(message, MALFORMED, named.malformed)
        view = PodView(self.cluster, self.own, named.addresses)
        stream = generate_stream(self._over(view), message, is_prompt_only=is_prompt_only)
        try:
            first = await anext(stream)
        except GatewayError as error:
            await stream.aclose()
            if not view.uses_named_prefill:
                raise
            self._fall_back(message, FAILED, f"{error.code.name} {error.message[:200]}")
            local = replace_id(message, f"{message.request_id}-local")  # the failed attempt's id may linger
            stream = generate_stream(self._over(PodView(self.cluster, self.own)), local, is_prompt_only=is_prompt_only)
            first = await anext(stream)
        else:
            self._note_choice(message, view)
        async with contextlib.aclosing(stream):
            yield first
            async for response in stream:
                yield response

    def _over(self, view: PodView) -> GatewayState:
        return replace(self.state, relay=replace(self.state.relay, view=view))

    def _note_choice(self, message: gateway_pb2.GenerateRequest, view: PodView) -> None:
        if view.uses_named_prefill:
            self.counters.record(ROUTED)
        elif view.choice is not None:
            self._fall_back(message, view.choice.reason, view.choice.detail)

    def _fall_back(self, message: gateway_pb2.GenerateRequest, reason: str, detail: str) -> None:
        self.counters.record(reason)
        logger.warning("request %s: computing the prompt here, not on the named prefill endpoint (%s: %s)",
                       message.request_id, reason, detail,
                       extra={"request_id": message.request_id, "prefill_fallback": reason})


def replace_id(message: gateway_pb2.GenerateRequest, request_id: str) -> gateway_pb2.GenerateRequest:
    copy = gateway_pb2.GenerateRequest()
    copy.CopyFrom(message)
    copy.request_id = request_id
    return copy
