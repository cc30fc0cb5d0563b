"""Refuse text that cannot be encoded: JSON allows lone surrogates ("a\\ud800b"), UTF-8,
protobuf strings and the tokenizer do not.

`check_encodable(body)` walks a parsed request body and raises InvalidRequestError naming
the first field (top-level name, with the path inside it in the message) holding such text.
"""

from typing import Any

from pydantic import BaseModel

from shared.errors import InvalidRequestError


def check_encodable(body: BaseModel) -> None:
    for name, value in body.model_dump(by_alias=True, exclude_none=True).items():
        path = _first_unencodable(value, name)
        if path is not None:
            raise InvalidRequestError(name, f"{path} is not valid Unicode text (it holds a lone surrogate, "
                                            "U+D800 to U+DFFF)")


def _first_unencodable(value: Any, path: str) -> str | None:
    """The path of the first string (value or dict key) under `value` that UTF-8 cannot encode.
    Iterative, so that a deeply nested body (a JSON schema) cannot exhaust the stack."""
    pending = [(value, path)]
    while pending:
        item, item_path = pending.pop()
        if isinstance(item, str):
            if not _is_encodable(item):
                return item_path
        elif isinstance(item, dict):
            for key, child in reversed(list(item.items())):
                if isinstance(key, str) and not _is_encodable(key):
                    return f"{item_path} (a key)"
                pending.append((child, f"{item_path}.{key}"))
        elif isinstance(item, (list, tuple)):
            pending.extend((child, f"{item_path}[{index}]") for index, child in reversed(list(enumerate(item))))
    return None


def _is_encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
