"""SamplingParams: protobuf <-> dataclass. Unset proto fields keep the dataclass defaults,
except max_tokens: unset means up to the model's length, as in the OpenAI API. The guided
decoding message is converted by `shared.wire.guided`."""

from dataclasses import fields

from shared.errors import InvalidRequestError
from shared.pb.pdserve.v1 import generation_pb2 as pb
from shared.sampling.params import SamplingParams
from shared.wire.guided import guided_from_proto, guided_to_proto

_SCALAR_FIELDS = [f.name for f in fields(SamplingParams)
                  if f.name not in ("stop", "stop_token_ids", "best_of", "guided")]


def sampling_from_proto(message: pb.SamplingParams) -> SamplingParams:
    """Raises InvalidRequestError naming the field for any bad value."""
    values = {name: getattr(message, name) for name in _SCALAR_FIELDS if message.HasField(name)}
    values.setdefault("max_tokens", None)  # unset on the wire: up to the model's length
    values["stop"] = list(message.stop)
    values["stop_token_ids"] = list(message.stop_token_ids)
    if message.HasField("guided"):
        values["guided"] = guided_from_proto(message.guided)
    try:
        return SamplingParams(**values)
    except InvalidRequestError:
        raise
    except (TypeError, ValueError) as error:
        raise InvalidRequestError("sampling", str(error)) from error


def sampling_to_proto(params: SamplingParams) -> pb.SamplingParams:
    message = pb.SamplingParams(stop=list(params.stop), stop_token_ids=list(params.stop_token_ids))
    for name in _SCALAR_FIELDS:
        value = getattr(params, name)
        if value is not None:
            setattr(message, name, value)
    if params.guided is not None:
        message.guided.CopyFrom(guided_to_proto(params.guided))
    return message
