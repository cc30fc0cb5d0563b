"""The cluster as an instance's OpenAI door sees it for one request (services.instance.openai_door).

The gateway's relay asks its view for candidates and picks among them; here the choice is
already made: this pod decodes (an endpoint picker sent the request here), and the prompt is
computed by the prefill instance the request's header names (services.instance.prefill_header)
when one is usable, else here. So the candidates are this instance as a decode instance plus the
named prefill instances that can feed it (the gateway's relay then runs its disaggregated path:
Reserve here, StreamPrefill there with this instance as the KV destination, Decode here), or
this instance alone as a colocated one (Generate here).

A named endpoint is usable when a live prefill instance registered that gRPC address in this
model's namespace and can pair with this instance (same cache settings and KV protocol version:
services.gateway.pairing). Otherwise the prompt is computed here, for a reason: "unknown" (no
live instance has the address; another model's instances register elsewhere), "not_prefill"
(the instance there has another role), "incompatible" (it cannot pair with this one: another
pdserve or model version, other cache settings).
"""

from collections.abc import Callable
from dataclasses import dataclass, replace

from services.gateway.cluster_view import ClusterView, Listing
from services.gateway.pairing import can_pair, describe_mismatch
from services.gateway.prompt_hashes import PromptHashes
from services.gateway.router import COLOCATED, Candidate


@dataclass(frozen=True)
class PrefillChoice:
    prefills: tuple[Candidate, ...]  # the usable named prefill instances
    reason: str = ""  # why none is usable ("" when some is)
    detail: str = ""  # the same, in words, for the log


def choose_prefills(addresses: tuple[str, ...], listed: list[Candidate], own: Candidate) -> PrefillChoice:
    """The named prefill instances among `listed` that can feed `own`; else why none can (the
    first address's reason)."""
    usable, problems = [], []
    for address in addresses:
        matches = [c for c in listed if c.grpc_address == address]
        if not matches:
            problems.append(("unknown", f"no live instance registered {address}"))
        elif matches[0].role != "prefill":
            problems.append(("not_prefill", f"{address} is {matches[0].role} {matches[0].instance_id}"))
        elif not can_pair(matches[0], own):
            problems.append(("incompatible", describe_mismatch(matches[0], own)))
        else:
            usable.append(matches[0])
    if usable:
        return PrefillChoice(tuple(usable))
    reason, detail = problems[0] if problems else ("unknown", "no endpoint named")
    return PrefillChoice((), reason, detail)


class PodView:
    """The view a relay runs one request over (the ClusterView's interface that the relay uses)."""

    def __init__(self, cluster: ClusterView, own: Callable[[], Candidate], addresses: tuple[str, ...] = ()):
        self.cluster = cluster
        self.own = own  # this instance, as registered now
        self.addresses = addresses  # the named prefill endpoints
        self.choice: PrefillChoice | None = None  # the first choice made (None: none yet)
        self.failed: set[str] = set()  # instances that failed a call of this request

    async def candidates(self, prompt: PromptHashes) -> list[Candidate]:
        listed = await self.cluster.candidates(prompt)
        own = next((c for c in listed if c.instance_id == self.own().instance_id), None) or self.own()
        if not self.addresses:
            return [replace(own, role=COLOCATED)]
        choice = choose_prefills(self.addresses, listed, own)
        self.choice = self.choice or choice
        prefills = [c for c in choice.prefills if c.instance_id not in self.failed]
        return [replace(own, role="decode"), *prefills] if prefills else [replace(own, role=COLOCATED)]

    @property
    def uses_named_prefill(self) -> bool:
        return self.choice is not None and bool(self.choice.prefills)

    async def live(self) -> Listing:
        return await self.cluster.live()

    def draining(self) -> Listing:
        return self.cluster.draining()

    def mark_failed(self, instance_id: str) -> None:
        self.failed.add(instance_id)
        self.cluster.mark_failed(instance_id)

    def refresh(self) -> None:
        self.cluster.refresh()
