"""A loopback stand-in for llama-server, vLLM or a plain OpenAI-compatible server.

It serves the documents a kind of server serves (``/v1/models``, ``/props``, ``/slots``,
``/metrics``) and answers ``POST /v1/chat/completions`` by replaying a stream: one captured
from the real llama-server (``data/*.sse``), or one built in vLLM's documented chunk format.
Failures are scripted per test: an HTTP status, a stall, a connection cut mid-stream.
"""

from __future__ import annotations

import contextlib
import json
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

DATA = Path(__file__).parent / "data"


def sse_events(path: Path) -> list[str]:
    """The ``data: ...`` payloads of a captured stream, in order ([DONE] included)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    return [line[len("data: ") :] for line in lines if line.startswith("data: ")]


@dataclass
class Script:
    """What the fake server does; tests change it between requests."""

    documents: dict[str, tuple[int, str, str]] = field(default_factory=dict)
    """GET path -> (status, content type, body)."""
    stream: list[str] = field(default_factory=list)
    """SSE payloads for the next chat completion."""
    status: int = 200
    error_body: str = ""
    delay_s: float = 0.0
    """Pause before each event (a slow server)."""
    stall_s: float = 0.0
    """Pause before the first byte of the reply (longer than the client's timeout = a timeout)."""
    cut_after: int | None = None
    """Close the connection mid-body after this many events (a server killed mid-reply)."""
    after_reply: dict[str, tuple[int, str, str]] = field(default_factory=dict)
    """Documents that replace ``documents`` once a reply has streamed (metrics that moved)."""
    requests: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    disconnected: threading.Event = field(default_factory=threading.Event)
    """Set when the client hung up before the stream ended (a cancelled reply)."""


class QuietServer(ThreadingHTTPServer):
    """A client that hangs up mid-body (as specchat does once it has read enough of an error, or
    a bound is passed) is expected here, not an error to print."""

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class FakeServer:
    def __init__(self, script: Script) -> None:
        self.script = script
        handler = _handler_for(script)
        self.httpd = QuietServer(("127.0.0.1", 0), handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        assert isinstance(host, str), "a TCP address"
        return f"http://{host}:{port}"

    def __enter__(self) -> FakeServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _handler_for(script: Script) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # quiet tests
            pass

        def do_GET(self) -> None:
            script.headers.append(dict(self.headers))
            status, ctype, body = script.documents.get(
                self.path, (404, "application/json", '{"error":{"message":"not found"}}')
            )
            self._send(status, ctype, body)

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", "0"))
            body = json.loads(self.rfile.read(length) or b"{}")
            script.requests.append(body)
            script.headers.append(dict(self.headers))
            if self.path != "/v1/chat/completions":
                self._send(404, "application/json", '{"error":{"message":"no such endpoint"}}')
                return
            if script.stall_s:
                time.sleep(script.stall_s)
            if script.status != 200:
                self._send(script.status, "application/json", script.error_body)
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            try:
                for i, payload in enumerate(script.stream):
                    if script.cut_after is not None and i == script.cut_after:
                        self.wfile.write(b'20\r\ndata: {"cho')  # half a chunk, then nothing
                        self.wfile.flush()
                        self.connection.shutdown(socket.SHUT_RDWR)
                        return
                    if script.delay_s:
                        time.sleep(script.delay_s)
                    data = f"data: {payload}\n\n".encode()
                    self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                    self.wfile.flush()
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()
            except (BrokenPipeError, ConnectionResetError):
                script.disconnected.set()
                return
            script.documents.update(script.after_reply)

        def _send(self, status: int, ctype: str, body: str) -> None:
            data = body.encode()
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                self.wfile.write(data)  # the client may read what it needs of a long body and hang up

    return Handler


def llama_script(stream: str = "llama_cat_story_t0.sse", *, speculative: bool = True) -> Script:
    """llama-server as captured: its documents and one of its streams."""
    slots = json.loads((DATA / "llama_slots.json").read_text())
    for slot in slots:
        slot["speculative"] = speculative
    return Script(
        documents={
            "/v1/models": (200, "application/json", (DATA / "llama_models.json").read_text()),
            "/props": (200, "application/json", (DATA / "llama_props.json").read_text()),
            "/slots": (200, "application/json", json.dumps(slots)),
            "/metrics": (200, "text/plain", (DATA / "llama_metrics.txt").read_text()),
        },
        stream=sse_events(DATA / stream),
    )


VLLM_MODEL = "meta-llama/Llama-3.1-70B-Instruct"


def vllm_models() -> str:
    return json.dumps(
        {
            "object": "list",
            "data": [
                {
                    "id": VLLM_MODEL,
                    "object": "model",
                    "created": 0,
                    "owned_by": "vllm",
                    "root": VLLM_MODEL,
                    "parent": None,
                    "max_model_len": 8192,
                    "permission": [],
                }
            ],
        }
    )


def vllm_metrics(drafts: int, draft_tokens: int, accepted: int, per_pos: list[int]) -> str:
    """Prometheus text as vLLM's SpecDecodingProm writes it (counters get a _total suffix)."""
    labels = f'engine="0",model_name="{VLLM_MODEL}"'
    lines = [
        "# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.",
        "# TYPE vllm:spec_decode_num_drafts_total counter",
        f"vllm:spec_decode_num_drafts_total{{{labels}}} {drafts}.0",
        "# HELP vllm:spec_decode_num_draft_tokens_total Number of draft tokens.",
        "# TYPE vllm:spec_decode_num_draft_tokens_total counter",
        f"vllm:spec_decode_num_draft_tokens_total{{{labels}}} {draft_tokens}.0",
        "# HELP vllm:spec_decode_num_accepted_tokens_total Number of accepted tokens.",
        "# TYPE vllm:spec_decode_num_accepted_tokens_total counter",
        f"vllm:spec_decode_num_accepted_tokens_total{{{labels}}} {accepted}.0",
        "# HELP vllm:spec_decode_num_accepted_tokens_per_pos_total Accepted tokens per draft position.",
        "# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter",
    ]
    lines += [
        f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{labels},position="{i}"}} {n}.0'
        for i, n in enumerate(per_pos)
    ]
    return "\n".join(lines) + "\n"


def vllm_stream(
    steps: list[list[str]], *, finish: str = "stop", logprobs: bool = True, prompt_tokens: int = 21
) -> list[str]:
    """Chunks in vLLM's chat-completion format: one per engine step, continuous usage stats.

    ``steps`` lists each step's tokens (their texts); the first chunk carries the role, as vLLM's does.
    """
    base = {
        "id": "chatcmpl-0a1b",
        "object": "chat.completion.chunk",
        "created": 1764590000,
        "model": VLLM_MODEL,
    }
    out = [
        json.dumps(
            {
                **base,
                "choices": [
                    {
                        "index": 0,
                        "delta": {"role": "assistant", "content": ""},
                        "logprobs": None,
                        "finish_reason": None,
                    }
                ],
                "usage": {
                    "prompt_tokens": prompt_tokens,
                    "total_tokens": prompt_tokens,
                    "completion_tokens": 0,
                },
            }
        )
    ]
    done = 0
    for i, step in enumerate(steps):
        done += len(step)
        last = i == len(steps) - 1
        entry: dict[str, Any] = {
            "index": 0,
            "delta": {"content": "".join(step)},
            "finish_reason": finish if last else None,
        }
        entry["logprobs"] = (
            {
                "content": [
                    {"token": t, "logprob": -0.1, "bytes": list(t.encode()), "top_logprobs": []} for t in step
                ]
            }
            if logprobs
            else None
        )
        usage = {
            "prompt_tokens": prompt_tokens,
            "total_tokens": prompt_tokens + done,
            "completion_tokens": done,
        }
        out.append(json.dumps({**base, "choices": [entry], "usage": usage}))
    out.append(
        json.dumps(
            {
                **base,
                "choices": [],
                "usage": {
                    "prompt_tokens": prompt_tokens,
                    "total_tokens": prompt_tokens + done,
                    "completion_tokens": done,
                },
            }
        )
    )
    out.append("[DONE]")
    return out


def openai_stream(pieces: list[str]) -> list[str]:
    base = {"id": "chatcmpl-x", "object": "chat.completion.chunk", "created": 1764590000, "model": "gpt-test"}
    out = [
        json.dumps({**base, "choices": [{"index": 0, "delta": {"role": "assistant"}, "finish_reason": None}]})
    ]
    out += [
        json.dumps({**base, "choices": [{"index": 0, "delta": {"content": p}, "finish_reason": None}]})
        for p in pieces
    ]
    out.append(json.dumps({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}))
    out.append("[DONE]")
    return out


def openai_models() -> str:
    return json.dumps(
        {"object": "list", "data": [{"id": "gpt-test", "object": "model", "owned_by": "someone"}]}
    )


def llama_thinking_stream(rounds: list[tuple[str, list[str], int, int]]) -> list[str]:
    """llama-server parsing a thinking model's reasoning out (``--reasoning-format deepseek``):
    each round is (field, its tokens' texts, drafted, accepted), the field ``reasoning_content``
    or ``content``; a drafted round holds its accepted drafts and one closing token. The running
    counters step at each drafted round's first token, as llama-server's do (see
    specchat.remote.rounds), and the stop token is counted on the last chunk."""
    base = {
        "object": "chat.completion.chunk",
        "created": 1764590000,
        "id": "chatcmpl-think",
        "model": "qwen3",
    }
    out = [json.dumps({**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": None}}]})]
    predicted = drafted_total = accepted_total = 0

    def timings() -> dict[str, Any]:
        counters: dict[str, Any] = {"prompt_n": 20, "prompt_ms": 50.0, "predicted_n": predicted}
        counters["predicted_ms"] = 20.0 * predicted
        if drafted_total:
            counters.update(draft_n=drafted_total, draft_n_accepted=accepted_total)
        return counters

    for name, pieces, drafted, accepted in rounds:
        assert len(pieces) == accepted + 1
        drafted_total += drafted
        accepted_total += accepted
        for piece in pieces:
            predicted += 1
            choice = {"index": 0, "delta": {name: piece}, "finish_reason": None}
            out.append(json.dumps({**base, "choices": [choice], "timings": timings()}))
    predicted += 1  # the stop token
    out.append(
        json.dumps(
            {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}], "timings": timings()}
        )
    )
    out.append("[DONE]")
    return out


THINKING_ROUNDS: list[tuple[str, list[str], int, int]] = [
    ("reasoning_content", ["The"], 0, 0),
    ("reasoning_content", [" user", " says", " hi"], 3, 2),
    ("reasoning_content", [",", " so", " greet"], 3, 2),
    ("reasoning_content", [" back", "."], 3, 1),
    ("content", ["Hello", "!", " How", " are"], 3, 3),
    ("content", [" you", "?"], 3, 1),
]
"""A reply whose reasoning accepts 5 of 9 drafts and whose answer 4 of 6."""
