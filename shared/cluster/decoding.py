"""Turn Redis replies into text whether or not the client was made with decode_responses."""


def as_text(value: bytes | str) -> str:
    """Reply value (bytes from a raw client, str from a decoding one) as str."""
    if isinstance(value, bytes):
        return value.decode("utf-8")
    return value


def as_text_dict(mapping: dict) -> dict[str, str]:
    """HGETALL reply with keys and values as str."""
    return {as_text(key): as_text(value) for key, value in mapping.items()}
