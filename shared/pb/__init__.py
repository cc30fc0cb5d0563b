"""Generated protobuf/gRPC stubs (checked in). Source: proto/; generator: scripts/gen_proto.py.

Import messages as `from shared.pb.pdserve.v1 import kv_transfer_pb2`.
"""
