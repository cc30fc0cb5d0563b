"""The pieces a role plugs into an InstanceRuntime.

A role is up to three handlers on one engine: `prefill` (Prefill, StreamPrefill), `decode` (Reserve,
Renew, Decode, PrefillLocally, Release) and `generate` (Generate). The prefill role has the first, the decode role the
second, a colocated instance all three; with peer reuse every role also has `peer`
(SendCachedBlocks). The runtime starts them once the engine is loaded,
stops them at shutdown (after the gRPC server has drained), and lets each add its counters
to GetStatus.
"""

from dataclasses import dataclass

from shared.pb.pdserve.v1 import instance_pb2 as pb


class RoleHandler:
    """Base class with no-op hooks."""

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    def add_status(self, status: pb.InstanceStatus) -> None:
        pass

    async def hand_back(self) -> None:
        """The drain timeout passed: end the work still running so that gateways move it to
        another instance (decode streams fail UNAVAILABLE while health says NOT_SERVING)."""

    async def on_engine_restart(self) -> None:
        """The engine core was restarted (its requests and reservations died with the old
        one): drop what refers to them, before the instance serves again."""


@dataclass
class RoleHandlers:
    prefill: RoleHandler | None = None
    decode: RoleHandler | None = None
    generate: RoleHandler | None = None
    peer: RoleHandler | None = None

    def all(self) -> list[RoleHandler]:
        return [handler for handler in (self.prefill, self.decode, self.generate, self.peer) if handler is not None]

