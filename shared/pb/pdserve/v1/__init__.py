"""Generated protobuf stubs; regenerate with scripts/gen_proto.py. Do not edit."""
