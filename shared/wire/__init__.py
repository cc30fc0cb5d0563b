"""Conversions between the engine's dataclasses and the protobuf messages on the wire."""
