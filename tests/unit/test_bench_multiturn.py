"""`python -m benchmarks.multiturn`: its workload (round-robin turns, each after the chat's
previous answer, the answers carried into the next prompt) against a fake OpenAI chat server,
and its tables and targets."""

import asyncio
import http.server
import json
import threading

import pytest

from benchmarks.multiturn import run_workload
from benchmarks.multiturn_client import TurnResult
from benchmarks.multiturn_report import source_table, targets, ttft_table
from benchmarks.multiturn_servers import MultiturnServerOptions, RunningServer
from benchmarks.multiturn_workload import ChatTexts, ChatWorkload, round_robin


class FakeChatServer(http.server.ThreadingHTTPServer):
    """Streams "answer-<n>" for the n-th request, with a usage chunk; records every request body."""

    def __init__(self):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.bodies: list[dict] = []
        self.lock = threading.Lock()


class _Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_GET(self):
        self._send(200, json.dumps({"data": [{"id": "fake-model"}]}).encode(), "application/json")

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with self.server.lock:
            self.server.bodies.append(body)
            number = len(self.server.bodies)
        events = [{"choices": [{"delta": {"content": f"answer-{number}"}}]},
                  {"choices": [], "usage": {"prompt_tokens": 100, "prompt_tokens_details": {"cached_tokens": 60}}}]
        stream = "".join(f"data: {json.dumps(event)}\n\n" for event in events) + "data: [DONE]\n\n"
        self._send(200, stream.encode(), "text/event-stream")

    def _send(self, status: int, payload: bytes, content_type: str):
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)


@pytest.fixture
def fake_server():
    server = FakeChatServer()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def test_turns_go_round_robin_each_after_the_chats_previous_answer(fake_server):
    workload = ChatWorkload(num_chats=3, num_turns=2, concurrency=2, output_tokens=5)
    texts = ChatTexts("system text", [[f"chat{c}-turn{t}" for t in (1, 2)] for c in range(3)])
    server = RunningServer("fake", f"http://127.0.0.1:{fake_server.server_port}", [])
    results = asyncio.run(run_workload(server, workload, texts))
    assert [turn.chat for turn in round_robin(workload)] == [0, 1, 2, 0, 1, 2]
    assert len(results) == 6 and all(r.is_ok and r.cached_tokens == 60 and r.prompt_tokens == 100 for r in results)
    second_turns = [body for body in fake_server.bodies if len(body["messages"]) == 4]
    assert len(second_turns) == 3
    for body in second_turns:  # system, user 1, the answer it got, user 2
        roles = [message["role"] for message in body["messages"]]
        assert roles == ["system", "user", "assistant", "user"]
        chat = body["messages"][1]["content"].split("-")[0]
        assert body["messages"][3]["content"] == f"{chat}-turn2"
        assert body["messages"][2]["content"].startswith("answer-")
        assert body["max_tokens"] == 5 and body["temperature"] == 0.0 and body["ignore_eos"] is True


def result(turn: int, ttft_s: float) -> TurnResult:
    return TurnResult(chat=0, turn=turn, start_s=0.0, ttft_s=ttft_s, prompt_tokens=100, cached_tokens=50)


def test_the_tables_and_targets():
    series = {"pdserve-tiers": [result(1, 1.0), result(2, 0.3), result(3, 0.3)],
              "pdserve-no-tiers": [result(1, 1.0), result(2, 1.0), result(3, 0.5)],
              "vllm": [result(1, 0.5), result(2, 0.6), result(3, 0.2)]}
    table = ttft_table(series)
    assert "| 2 | 300 | 300 | 1000 | 1000 | 600 | 600 |" in table and table.splitlines()[-1].startswith("| 2+ |")
    lines = targets(series)
    assert lines[0].startswith("turn 2: TTFT p50 tiers / no tiers = 0.30") and lines[0].endswith("met)")
    assert lines[1].startswith("turn 3: TTFT p50 tiers / no tiers = 0.60") and lines[1].endswith("missed)")
    assert lines[2].startswith("turns 2+: TTFT p99 pdserve-tiers / vllm = 0.50")
    caches = {"pdserve-tiers": {"queries": 1000, "hits": 700, "host_tokens": 300, "peer_tokens": 100}}
    assert "| pdserve-tiers | 1000 | 30.0% | 30.0% | 0.0% | 10.0% | 30.0% | 50.0% |" in source_table(caches, series)


def test_pool_tokens_follow_the_pool_size():
    assert MultiturnServerOptions(None, 1.0, -1).pool_tokens == 2**30 // (2 * 30 * 3 * 64 * 2)  # ~46k SmolLM2 tokens
