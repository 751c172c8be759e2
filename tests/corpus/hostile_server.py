"""A loopback server that misbehaves on purpose, one case per path prefix.

``specchat --server http://127.0.0.1:PORT/NAME`` sends ``GET /NAME/v1/models`` and ``POST
/NAME/v1/chat/completions``; each case answers them with a function that writes raw bytes to the
socket, so it can send what no well-behaved HTTP library would: a gzip bomb, a line that never
ends, one byte a second, keep-alive comments forever. Every endless answer stops by itself after
:data:`SERVE_LIMIT_S` or when the client hangs up, and the server listens on 127.0.0.1 only.
"""

from __future__ import annotations

import functools
import json
import threading
import time
import zlib
from collections.abc import Callable, Iterable
from http.server import BaseHTTPRequestHandler
from typing import Any

from tests.remote.server import QuietServer

Answer = Callable[[BaseHTTPRequestHandler], None]
SERVE_LIMIT_S = 90.0
"""No answer writes for longer than this, whether or not the client is still reading."""
CHUNK_BASE = {"id": "chatcmpl-h", "object": "chat.completion.chunk", "created": 1764590000, "model": "m"}


class HostileServer:
    """``routes[name]["GET /v1/models"]`` (or ``"POST /v1/chat/completions"``) answers for a case."""

    def __init__(self) -> None:
        self.routes: dict[str, dict[str, Answer]] = {}
        self.requests: list[tuple[str, dict[str, str], bytes]] = []
        routes, requests = self.routes, self.requests

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                self._answer("GET", b"")

            def do_POST(self) -> None:
                self._answer("POST", self.rfile.read(int(self.headers.get("Content-Length", "0"))))

            def _answer(self, method: str, body: bytes) -> None:
                _, name, rest = self.path.split("/", 2)
                requests.append((f"{method} /{rest}", dict(self.headers), body))
                answer = routes.get(name, {}).get(f"{method} /{rest}")
                try:
                    if answer is None:
                        send(self, 404, "application/json", b'{"error": {"message": "no such thing"}}')
                    else:
                        answer(self)
                except (BrokenPipeError, ConnectionResetError, TimeoutError):
                    pass  # the client hung up: what it was meant to do

        self.httpd = QuietServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def url(self, name: str) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host!s}:{port}/{name}"

    def __enter__(self) -> HostileServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


# ---------------------------------------------------------------------------------- writing


def send(
    handler: BaseHTTPRequestHandler,
    status: int,
    ctype: str,
    body: bytes,
    headers: Iterable[tuple[str, str]] = (),
) -> None:
    handler.send_response(status)
    handler.send_header("Content-Type", ctype)
    handler.send_header("Content-Length", str(len(body)))
    for name, value in headers:
        handler.send_header(name, value)
    handler.end_headers()
    handler.wfile.write(body)


def start_chunked(
    handler: BaseHTTPRequestHandler, ctype: str, headers: Iterable[tuple[str, str]] = ()
) -> None:
    handler.send_response(200)
    handler.send_header("Content-Type", ctype)
    handler.send_header("Transfer-Encoding", "chunked")
    for name, value in headers:
        handler.send_header(name, value)
    handler.end_headers()


def write_chunk(handler: BaseHTTPRequestHandler, data: bytes) -> None:
    handler.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
    handler.wfile.flush()


def end_chunked(handler: BaseHTTPRequestHandler) -> None:
    handler.wfile.write(b"0\r\n\r\n")
    handler.wfile.flush()


def repeat(handler: BaseHTTPRequestHandler, piece: bytes, every_s: float = 0.0) -> None:
    """``piece`` as chunks, again and again, until the client leaves or the time is up."""
    until = time.monotonic() + SERVE_LIMIT_S
    while time.monotonic() < until:
        write_chunk(handler, piece)
        if every_s:
            time.sleep(every_s)


# ---------------------------------------------------------------------------------- answers


def models(model: str = "m", owner: str = "someone") -> Answer:
    doc = json.dumps({"object": "list", "data": [{"id": model, "object": "model", "owned_by": owner}]})
    return lambda h: send(h, 200, "application/json", doc.encode())


def document(body: str, status: int = 200, ctype: str = "application/json") -> Answer:
    return lambda h: send(h, status, ctype, body.encode())


def chunk(
    content: str | None = None,
    finish: str | None = None,
    *,
    reasoning: str | None = None,
    usage: dict[str, Any] | None = None,
    timings: dict[str, Any] | None = None,
) -> str:
    delta: dict[str, Any] = {}
    if content is not None:
        delta["content"] = content
    if reasoning is not None:
        delta["reasoning_content"] = reasoning
    data: dict[str, Any] = {**CHUNK_BASE, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    if usage is not None:
        data["usage"] = usage
    if timings is not None:
        data["timings"] = timings
    return json.dumps(data)  # allow_nan: NaN and Infinity written as Python's reader takes them


def stream(payloads: Iterable[str], every_s: float = 0.0) -> Answer:
    """A reply: ``data:`` lines, then ``[DONE]``."""

    def answer(h: BaseHTTPRequestHandler) -> None:
        start_chunked(h, "text/event-stream")
        for payload in payloads:
            write_chunk(h, f"data: {payload}\n\n".encode())
            if every_s:
                time.sleep(every_s)
        write_chunk(h, b"data: [DONE]\n\n")
        end_chunked(h)

    return answer


def reply(pieces: list[str], **extra: Any) -> Answer:
    return stream([*(chunk(p) for p in pieces), chunk(finish="stop", **extra)])


def endless_tokens(every_s: float = 0.0) -> Answer:
    """A server that ignores max_tokens: tokens until the client leaves."""

    def answer(h: BaseHTTPRequestHandler) -> None:
        start_chunked(h, "text/event-stream")
        repeat(h, f"data: {chunk(' word')}\n\n".encode(), every_s)

    return answer


def keepalive(first: list[str], piece: bytes, every_s: float) -> Answer:
    """Some tokens, then ``piece`` (comments, empty chunks, single bytes) every ``every_s``."""

    def answer(h: BaseHTTPRequestHandler) -> None:
        start_chunked(h, "text/event-stream")
        for text in first:
            write_chunk(h, f"data: {chunk(text)}\n\n".encode())
        repeat(h, piece, every_s)

    return answer


def dribbled_models(every_s: float = 1.0) -> Answer:
    """/v1/models one byte at a time."""

    def answer(h: BaseHTTPRequestHandler) -> None:
        start_chunked(h, "application/json")
        doc = json.dumps({"object": "list", "data": [{"id": "m" * 10_000, "owned_by": "x"}]}).encode()
        until = time.monotonic() + SERVE_LIMIT_S
        for byte in doc:
            if time.monotonic() > until:
                return
            write_chunk(h, bytes([byte]))
            time.sleep(every_s)
        end_chunked(h)

    return answer


@functools.cache
def gzip_bomb(inflated: int = 1 << 30) -> bytes:
    """``inflated`` zero bytes, gzipped: about a thousandth of that on the wire."""
    squeeze = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    zeros = bytes(1 << 20)
    parts = [squeeze.compress(zeros) for _ in range(inflated >> 20)]
    return b"".join([*parts, squeeze.flush()])


def bomb(status: int, ctype: str) -> Answer:
    """A gzip bomb as the whole answer: a reply stream, an error body or a document."""
    return lambda h: send(h, status, ctype, gzip_bomb(), [("Content-Encoding", "gzip")])


def endless_line(status: int = 200, ctype: str = "text/event-stream") -> Answer:
    """A body with no line break, until the client leaves."""

    def answer(h: BaseHTTPRequestHandler) -> None:
        h.send_response(status)
        h.send_header("Content-Type", ctype)
        h.send_header("Transfer-Encoding", "chunked")
        h.end_headers()
        write_chunk(h, b"data: ")
        repeat(h, b"a" * 65536)

    return answer


def redirect(to: str, status: int = 307) -> Answer:
    return lambda h: send(h, status, "text/plain", b"moved", [("Location", to)])


def echo_key(status: int = 401) -> Answer:
    """An error that quotes the Authorization header it received."""

    def answer(h: BaseHTTPRequestHandler) -> None:
        auth = h.headers.get("Authorization", "")
        body = json.dumps({"error": {"message": f"bad key {auth} ({auth.removeprefix('Bearer ')})"}})
        send(h, status, "application/json", body.encode())

    return answer


def error(status: int, message: str) -> Answer:
    return lambda h: send(h, status, "application/json", json.dumps({"error": {"message": message}}).encode())
