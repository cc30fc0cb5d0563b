"""The three error kinds map to the right status in one place each: a bad request is
INVALID_ARGUMENT / 400 naming the field; a bad setting or a bug is INTERNAL / 500, and the
gateway's client never sees a bug's details."""

import grpc
import pytest

from services.rpc.errors import grpc_status_of
from services.gateway.errors import from_exception
from services.gateway.http.errors import from_gateway_error
from shared.errors import ConfigurationError, InternalError, InvalidRequestError


@pytest.mark.parametrize("error, code, message", [
    (InvalidRequestError("max_tokens", "must be >= 1"), grpc.StatusCode.INVALID_ARGUMENT, "max_tokens: must be >= 1"),
    (ConfigurationError("draft_model", "not found"), grpc.StatusCode.INTERNAL,
     "server misconfigured: draft_model: not found"),
    (InternalError("block 3 freed twice"), grpc.StatusCode.INTERNAL, "internal error: block 3 freed twice"),
    (KeyError("x"), grpc.StatusCode.INTERNAL, "KeyError: 'x'"),
])
def test_instances_map_each_kind_to_its_grpc_code(error, code, message):
    assert grpc_status_of(error) == (code, message)


@pytest.mark.parametrize("error, code, http_status, message", [
    (InvalidRequestError("max_tokens", "must be >= 1"), grpc.StatusCode.INVALID_ARGUMENT, 400,
     "max_tokens: must be >= 1"),
    (ConfigurationError("block_size", "differs"), grpc.StatusCode.INTERNAL, 500,
     "gateway misconfigured: block_size; see the gateway log"),
    (InternalError("secret detail"), grpc.StatusCode.INTERNAL, 500, "internal gateway error; see the gateway log"),
])
def test_the_gateway_maps_each_kind_to_grpc_and_http(error, code, http_status, message):
    answer = from_exception(error)
    assert (answer.code, answer.message) == (code, message)
    http = from_gateway_error(answer, renamed={})
    assert (http.status, http.message) == (http_status, message)
    assert http.param == ("max_tokens" if http_status == 400 else None)


def test_a_configuration_error_is_no_request_error():
    assert not isinstance(ConfigurationError("port", "taken"), ValueError)
    assert not isinstance(InternalError("bug"), ValueError)
    assert str(ConfigurationError("port", "taken")) == "port: taken"
