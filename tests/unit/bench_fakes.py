"""Stand-ins for the pdserve-against-vLLM benchmarks' tests: a fake `vllm serve` (an HTTP server
that streams `max_tokens` one-token chunks for completions and chats, and records every request
body) and `fake_run`, a RunResult with hand-made request times."""

import sys
import textwrap

import pytest

from services.bench.metrics import summarize
from services.bench.records import RequestRecord
from services.bench.runner import LoadShape, RunResult

FAKE_VLLM = textwrap.dedent('''
    """Stands in for `python -m vllm.entrypoints.openai.api_server --model FOLDER --port P ...`."""
    import http.server, json, os, sys

    argv = sys.argv[1:]
    assert argv[:2] == ["-m", "vllm.entrypoints.openai.api_server"], argv
    port = int(argv[argv.index("--port") + 1])
    bodies = os.environ["FAKE_VLLM_BODIES"]

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self):
            model = argv[argv.index("--model") + 1]
            body = json.dumps({"data": [{"id": model}]}).encode() if self.path == "/v1/models" else b""
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self):
            request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            with open(bodies, "a") as file:
                file.write(json.dumps({"path": self.path, **request}) + "\\n")
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            choice = {"delta": {"content": "x"}} if self.path.endswith("/chat/completions") else {"text": "x"}
            events = [{"choices": [choice]}] * request["max_tokens"]
            events.append({"choices": [], "usage": {"completion_tokens": request["max_tokens"]}})
            for event in events:
                self.wfile.write(b"data: " + json.dumps(event).encode() + b"\\n\\n")
            self.wfile.write(b"data: [DONE]\\n\\n")

        def log_message(self, *args):
            pass

    http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
''')


@pytest.fixture
def fake_vllm_python(tmp_path, monkeypatch):
    """(an executable standing in for vLLM's python, the JSONL file of the bodies it was sent)."""
    script = tmp_path / "fake_vllm.py"
    script.write_text(FAKE_VLLM)
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{script}" "$@"\n')
    python.chmod(0o755)
    monkeypatch.setenv("FAKE_VLLM_BODIES", str(tmp_path / "bodies.jsonl"))
    return python, tmp_path / "bodies.jsonl"


def fake_run(label: str, ttft_s: float, gap_s: float, failed: int = 0, rate: float = 1.0,
             duration_s: float = 1.0, error: str = "HTTP 500") -> RunResult:
    """Two requests of 3 tokens, `gap_s` apart after `ttft_s`; `failed` more that failed with
    `error`; the run took `duration_s`."""
    records = []
    for index in range(2):
        record = RequestRecord(index, prompt_len=8, expected_output_len=3)
        for position in range(3):
            record.add_chunk(ttft_s + position * gap_s, 1)
        record.end_s = ttft_s + 2 * gap_s
        records.append(record)
    for index in range(failed):
        record = RequestRecord(2 + index, prompt_len=8, expected_output_len=3)
        record.error, record.end_s = error, 0.1
        records.append(record)
    return RunResult(label, LoadShape(rate), records, summarize(records, duration_s=duration_s, percentiles=(50, 99, 100)))
