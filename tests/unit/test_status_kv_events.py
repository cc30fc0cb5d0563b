"""`pdserve status` lists where each instance publishes its KV-cache events: the endpoint goes
into the instance's Redis record (absent from older records: none) and into the table."""

from services.cli.status_command import print_table
from shared.cluster.instance_records import InstanceInfo, InstanceLoad, decode_instance, encode_instance
from shared.cluster.keys import ClusterNamespace


def info(endpoint: str) -> InstanceInfo:
    return InstanceInfo("d0", "decode", "127.0.0.1:1", "", "m", kv_events_endpoint=endpoint)


def test_the_endpoint_survives_the_redis_record_and_older_records_have_none():
    assert decode_instance(encode_instance(info("tcp://*:5558"), InstanceLoad()))[0].kv_events_endpoint == \
        "tcp://*:5558"
    record = encode_instance(info(""), InstanceLoad())
    assert "kv_events_endpoint" not in record and decode_instance(record)[0].kv_events_endpoint == ""


def test_the_table_lists_each_instances_endpoint(capsys):
    print_table(ClusterNamespace("default", "m"), [(info("tcp://*:5558"), InstanceLoad())], [])
    header, row = capsys.readouterr().out.splitlines()[1:3]
    assert header.split()[-2:] == ["KV", "EVENTS"] and row.split()[-1] == "tcp://*:5558"
