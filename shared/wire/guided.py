"""GuidedDecodingParams: protobuf `GuidedDecoding` <-> dataclass (used by `shared.wire.sampling`).

The proto's oneof holds exactly one constraint; a dict JSON schema goes out as JSON text.
"""

from shared.errors import InvalidRequestError
from shared.guided.params import GuidedDecodingParams
from shared.pb.pdserve.v1 import generation_pb2 as pb


def guided_from_proto(message: pb.GuidedDecoding) -> GuidedDecodingParams:
    """Raises InvalidRequestError naming the field ("guided", "guided.choice", ...)."""
    kind = message.WhichOneof("constraint")
    if kind is None:
        raise InvalidRequestError("guided", "set one of json_schema, json_object, regex, choice, grammar")
    if kind == "choice":
        return GuidedDecodingParams(choice=list(message.choice.choices))
    return GuidedDecodingParams(**{kind: getattr(message, kind)})


def guided_to_proto(guided: GuidedDecodingParams) -> pb.GuidedDecoding:
    kind = guided.kind
    if kind == "choice":
        return pb.GuidedDecoding(choice=pb.GuidedChoice(choices=list(guided.choice)))
    if kind == "json_object":
        return pb.GuidedDecoding(json_object=True)
    return pb.GuidedDecoding(**{kind: guided.text})
