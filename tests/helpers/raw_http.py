"""Raw HTTP calls to the gateway's OpenAI API (no client library, so any body can be sent)
and the check that an error has OpenAI's shape with a bounded message."""

import json
import urllib.error
import urllib.request

MAX_ERROR_BODY_BYTES = 2048


def post(address: str, path: str, body, method: str = "POST", headers: dict[str, str] | None = None,
         scheme: str = "http", timeout_s: float = 30.0) -> tuple[int, dict, dict]:
    """(status, JSON body, headers) of one request; `body` bytes, None or JSON-able. An error
    body must be small."""
    data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"{scheme}://{address}{path}", data=data, method=method,
                                     headers={"content-type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as reply:
            raw, status, reply_headers = reply.read(), reply.status, dict(reply.headers)
    except urllib.error.HTTPError as error:
        raw, status, reply_headers = error.read(), error.code, dict(error.headers)
    assert len(raw) < MAX_ERROR_BODY_BYTES or status == 200, f"{len(raw)}-byte answer with status {status}"
    return status, json.loads(raw), reply_headers


def assert_openai_error(status: int, body: dict, expected_status: int | None = None,
                        param: str | None = None) -> None:
    """OpenAI's `{"error": {"message", "type", "param", "code"}}`; a 4xx unless told which."""
    if expected_status is None:
        assert 400 <= status < 500, (status, body)
    else:
        assert status == expected_status, (status, body)
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
    assert len(body["error"]["message"]) <= 1024
    if param is not None:
        assert body["error"]["param"] == param, body
        assert body["error"]["message"].startswith(param), body
