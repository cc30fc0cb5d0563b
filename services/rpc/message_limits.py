"""gRPC message limits shared by every internal hop (gateway -> instance channels and the
instances' servers), so that anything the gateway accepts always fits.

The gateway's request limits (services.gateway.limits) are checked against
MAX_INTERNAL_MESSAGE_BYTES at start-up; responses carrying prompt logprobs of long prompts
are the largest messages and fit too.
"""

MAX_INTERNAL_MESSAGE_BYTES = 64 * 1024 * 1024


def message_size_options(max_bytes: int = MAX_INTERNAL_MESSAGE_BYTES) -> list[tuple[str, int]]:
    return [("grpc.max_receive_message_length", max_bytes), ("grpc.max_send_message_length", max_bytes)]
