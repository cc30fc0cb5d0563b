"""SamplingParams over the wire (shared/wire/sampling.py): every field survives a protobuf
round trip, unset fields keep the dataclass defaults, and bad values name their field."""

import pytest

from shared.errors import InvalidRequestError
from shared.pb.pdserve.v1 import generation_pb2 as pb
from shared.sampling.params import SamplingParams
from shared.wire.sampling import sampling_from_proto, sampling_to_proto


def round_trip(params: SamplingParams) -> SamplingParams:
    wire = sampling_to_proto(params).SerializeToString()
    return sampling_from_proto(pb.SamplingParams.FromString(wire))


def test_every_field_survives_a_round_trip():
    params = SamplingParams(n=2, temperature=0.7, top_p=0.9, top_k=20, min_p=0.05, repetition_penalty=1.1,
                            presence_penalty=0.2, frequency_penalty=0.3, seed=7, max_tokens=33, min_tokens=3,
                            stop=["\n\n"], stop_token_ids=[5, 6], ignore_eos=True, logprobs=2, prompt_logprobs=1,
                            skip_special_tokens=False, include_stop_str_in_output=True, use_speculation=False)
    assert round_trip(params) == params


def test_unset_fields_take_the_defaults_and_max_tokens_means_up_to_the_model():
    params = sampling_from_proto(pb.SamplingParams())
    assert params.use_speculation is True
    assert params.max_tokens is None
    assert params == SamplingParams(max_tokens=None)


def test_bad_values_name_their_field():
    with pytest.raises(InvalidRequestError, match="top_p"):
        sampling_from_proto(pb.SamplingParams(top_p=1.5))
