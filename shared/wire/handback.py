"""The one wire convention of a drain hand-back: a decode instance whose drain timed out ends
its running Decode streams with UNAVAILABLE and a message starting with HANDED_BACK, so the
gateway moves them (reason "drain") without asking a server that may already be gone."""

HANDED_BACK = "handed back by a draining instance"


def handed_back_message(request_id: str) -> str:
    return f"{HANDED_BACK}: move {request_id!r} to another instance"


def is_handed_back(details: str | None) -> bool:
    return bool(details) and details.startswith(HANDED_BACK)
