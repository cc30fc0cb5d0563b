"""Key scheme: everything under pdserve:{deployment}:{model}:, names validated."""

import pytest

from shared.cluster.keys import ClusterNamespace, validate_block_hashes
from shared.errors import InternalError, InvalidRequestError


def test_keys_are_namespaced_by_deployment_and_model():
    namespace = ClusterNamespace("prod", "SmolLM2-135M-Instruct")
    assert namespace.prefix == "pdserve:prod:SmolLM2-135M-Instruct"
    assert namespace.instances() == "pdserve:prod:SmolLM2-135M-Instruct:instances"
    assert namespace.instance("p0") == "pdserve:prod:SmolLM2-135M-Instruct:instance:p0"
    assert namespace.prefix_held("d1") == "pdserve:prod:SmolLM2-135M-Instruct:prefix:held:d1"
    assert namespace.prefix_indexed() == "pdserve:prod:SmolLM2-135M-Instruct:prefix:indexed"
    assert (namespace.ownership("d1", "req-7")
            == "pdserve:prod:SmolLM2-135M-Instruct:ownership:d1:req-7")
    assert namespace.ownership_pattern() == "pdserve:prod:SmolLM2-135M-Instruct:ownership:*"


@pytest.mark.parametrize("field, kwargs", [
    ("deployment", {"deployment": "a:b", "model": "m"}),
    ("deployment", {"deployment": "", "model": "m"}),
    ("model", {"deployment": "prod", "model": "m*"}),
    ("model", {"deployment": "prod", "model": "has space"}),
])
def test_names_that_would_break_the_key_scheme_are_rejected(field, kwargs):
    with pytest.raises(InvalidRequestError) as caught:
        ClusterNamespace(**kwargs)
    assert caught.value.field == field


def test_block_hashes_must_be_32_byte_digests():
    assert validate_block_hashes((b"\x01" * 32,)) == [b"\x01" * 32]
    with pytest.raises(InternalError, match=r"block_hashes: item 1 must be 32 bytes"):
        validate_block_hashes([b"\x01" * 32, b"\x02" * 31])
    with pytest.raises(InternalError, match=r"block_hashes: must be a list"):
        validate_block_hashes(b"\x01" * 32)
