"""The one wire convention of a drain hand-back: a decode instance whose drain timed out ends
its running Decode streams with UNAVAILABLE and the trailing metadata key HANDED_BACK_METADATA_KEY
(the value: the request id), so the gateway moves them (reason "drain") without asking a server
that may already be gone. The message is for people; the gateway reads only the key."""

HANDED_BACK_METADATA_KEY = "pdserve-handed-back"


def handed_back_message(request_id: str) -> str:
    return f"handed back by a draining instance: move {request_id!r} to another instance"


def handed_back_trailer(request_id: str) -> tuple[tuple[str, str], ...]:
    return ((HANDED_BACK_METADATA_KEY, request_id),)


def is_handed_back(trailing_metadata) -> bool:
    """`trailing_metadata`: a failed call's (key, value) pairs, or None."""
    return any(key == HANDED_BACK_METADATA_KEY for key, _ in (trailing_metadata or ()))
