"""The HTTP side: one httpx client per server, errors turned into one line each.

Server-sent events are read line by line from a streamed response (``data: {...}`` lines,
``data: [DONE]`` at the end). A reader thread does the reading, so Esc stops a reply even while
the server is still prefilling and sends nothing. What a server sends is read within bounds
(:mod:`specchat.remote.bounded`) and within time (a document by a deadline; a reply by the
backend's stall rule), and every failure, a redirect included, is one line naming the server.
"""

from __future__ import annotations

import json
import os
import queue
import re
import threading
import time
from collections.abc import Container, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from html import unescape
from typing import Any
from urllib.parse import urlsplit

import httpx

from specchat.remote.bounded import (
    ACCEPTED_ENCODINGS,
    INFLATE_STEP,
    MAX_DOCUMENT_BYTES,
    MAX_ERROR_BYTES,
    Breach,
    inflated,
    lines,
    loads,
    read_capped,
)
from specchat.remote.chunks import DONE, parse_sse_line
from specchat.remote.server_errors import ServerError
from specchat.untrusted import remember_secret, server_text

API_KEY_ENV = "SPECCHAT_API_KEY"
"""The only place the API key comes from: never a flag (shell history), never the config file."""
CONNECT_TIMEOUT = 10.0
CANCEL_POLL = 0.05
"""Seconds between looks at the cancel flag while waiting for the server."""
DEFAULT_TIMEOUT = 60.0
"""Seconds a reply waits for the server's next token (its first, prefill included) before it
stalls, and a request for its next byte: the ``server_timeout`` setting."""
DOCUMENT_DEADLINE = 30.0
"""Seconds a document (GET) may take to arrive whole, or the start-up probe all of its."""
MAX_STREAM_BYTES = 1 << 40
"""No cap on a whole stream's bytes: each line is capped and dropped once read, and the reply's
tokens, text and time are bounded by the backend."""


def normalize_url(url: str) -> str:
    """``http://host:port`` from what a user may type (a trailing ``/v1`` or ``/`` is dropped)."""
    text = url.strip()
    if "://" not in text:
        raise ServerError(f"--server {url!r} is not a URL: give the scheme too, e.g. http://127.0.0.1:8080.")
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https"):
        raise ServerError(f"--server {url!r}: only http:// and https:// servers are supported.")
    try:
        port = parts.port
    except ValueError as err:
        raise ServerError(f"--server {url!r} has a bad port number.") from err
    if not parts.hostname:
        raise ServerError(f"--server {url!r} names no host: e.g. http://127.0.0.1:8080.")
    path = parts.path.rstrip("/")
    if path.endswith("/v1"):
        path = path[: -len("/v1")]
    netloc = parts.hostname if port is None else f"{parts.hostname}:{port}"
    if ":" in parts.hostname:  # an IPv6 literal keeps its brackets
        netloc = f"[{parts.hostname}]" + ("" if port is None else f":{port}")
    return f"{parts.scheme}://{netloc}{path}"


def api_key_from_env() -> str | None:
    key = os.environ.get(API_KEY_ENV, "").strip()
    return key or None


@dataclass(frozen=True)
class _Deadline:
    until: float
    seconds: float
    doing: str
    """What the time was for, as it ends "took more than N s …"."""


class ServerClient:
    """GET and streamed POST against one server, every failure a ServerError with one line.

    Everything read is bounded (:mod:`specchat.remote.bounded`): bodies are inflated as they
    stream, within caps. A document (GET) must arrive whole within :data:`DOCUMENT_DEADLINE`
    seconds (or ``timeout``, if shorter), however the server dribbles; :meth:`deadline` sets
    one deadline for several (the start-up probe). A reply's time rule (the stall) is the
    backend's, which knows what a token is: the stream gives it a heartbeat to look at its clock.
    """

    def __init__(
        self,
        url: str,
        *,
        api_key: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        verify: bool = True,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.url = normalize_url(url)
        headers = {"Accept": "application/json", "Accept-Encoding": ACCEPTED_ENCODINGS}
        if api_key:
            remember_secret(api_key)  # a server that echoes it back must never get it shown
            headers["Authorization"] = f"Bearer {api_key}"
        self._options: dict[str, Any] = {
            "base_url": self.url,
            "headers": headers,
            "timeout": httpx.Timeout(timeout, connect=min(CONNECT_TIMEOUT, timeout)),
            "verify": verify,  # TLS certificates are checked unless the user turns it off
            "transport": transport,
            "follow_redirects": False,  # a redirect would carry the key elsewhere: named instead
        }
        self._client = httpx.Client(**self._options)
        self.timeout = timeout
        self._deadline: _Deadline | None = None

    def close(self) -> None:
        self._client.close()

    @contextmanager
    def deadline(self, seconds: float, doing: str) -> Iterator[None]:
        """Every GET inside must be done within ``seconds`` (or the timeout, if shorter) of now,
        all together; ``doing`` says what for, in the line that reports a breach."""
        seconds = min(seconds, self.timeout)
        self._deadline = _Deadline(time.monotonic() + seconds, seconds, doing)
        try:
            yield
        finally:
            self._deadline = None

    def get_json(self, path: str) -> Any:
        """A JSON document, or None when the server has no such endpoint (404/405/501) or the
        body is not JSON."""
        body = self._get(path, missing=(404, 405, 501))
        if body is None:
            return None
        try:
            return loads(body.decode("utf-8", "replace"), path)
        except Breach as err:
            raise ServerError(f"the server at {self.url} {err}.") from None
        except ValueError:
            return None

    def get_text(self, path: str) -> str | None:
        """A text document, or None when the server has no such endpoint or refuses it."""
        body = self._get(path, missing=range(400, 600))
        return None if body is None else body.decode("utf-8", "replace")

    def _get(self, path: str, missing: Container[int]) -> bytes | None:
        seconds = min(DOCUMENT_DEADLINE, self.timeout)
        deadline = self._deadline or _Deadline(time.monotonic() + seconds, seconds, f"to send {path}")
        left = max(0.01, deadline.until - time.monotonic())
        timeout = httpx.Timeout(left, connect=min(CONNECT_TIMEOUT, left))
        with self._errors(path), self._client.stream("GET", path, timeout=timeout) as response:
            self._refuse_redirect(response, path)
            if response.status_code in missing:
                return None
            self._raise_for_status(response, path)
            parts: list[bytes] = []
            for piece in self._body(response, MAX_DOCUMENT_BYTES, path):
                parts.append(piece)
                if time.monotonic() > deadline.until:
                    raise ServerError(
                        f"the server at {self.url} took more than {deadline.seconds:g} s {deadline.doing} "
                        f"({path} came a little at a time): is it overloaded?"
                    )
            return b"".join(parts)

    def stream_events(
        self,
        path: str,
        body: dict[str, Any],
        cancel: threading.Event | None = None,
        heartbeat: float | None = None,
    ) -> Iterator[dict[str, Any] | None]:
        """POST ``body`` and yield each server-sent event's JSON, until ``[DONE]`` or the end;
        with ``heartbeat``, also None whenever that many seconds pass without one, so the caller
        can look at its clock while the server sends nothing, or only comments.

        Returns within a poll interval once ``cancel`` is set, even while the server is still
        prefilling and sends nothing: the request runs in a reader thread, which closes the
        connection (so the server stops) as soon as it next hears from it. A stream that ends
        without a finish reason is the caller's to judge (some servers omit ``[DONE]``); a
        connection cut mid-body, or a bound passed, raises ServerError.
        """
        inbox: queue.Queue[tuple[str, Any]] = queue.Queue()
        stop = threading.Event()

        def read() -> None:
            try:
                for event in self._read_events(path, body, stop):
                    inbox.put(("event", event))
                inbox.put(("end", None))
            except BaseException as err:  # handed to the consumer, which raises it
                inbox.put(("error", err))

        threading.Thread(target=read, name="specchat-server-stream", daemon=True).start()
        beat = time.monotonic()
        try:
            while True:
                try:
                    kind, item = inbox.get(timeout=CANCEL_POLL)
                except queue.Empty:
                    if cancel is not None and cancel.is_set():
                        return
                    if heartbeat is not None and time.monotonic() - beat >= heartbeat:
                        beat = time.monotonic()
                        yield None
                    continue
                if cancel is not None and cancel.is_set():
                    return
                if kind == "end":
                    return
                if kind == "error":
                    raise item
                beat = time.monotonic()
                yield item
        finally:
            stop.set()

    def _read_events(
        self, path: str, body: dict[str, Any], stop: threading.Event
    ) -> Iterator[dict[str, Any]]:
        with self._errors(path), self._client.stream("POST", path, json=body) as response:
            self._refuse_redirect(response, path)
            self._raise_for_status(response, path)
            if _is_html(response):
                raise ServerError(self._html_answer(response, path))
            try:
                for line in lines(self._body(response, MAX_STREAM_BYTES, "a reply stream")):
                    if stop.is_set():
                        return  # leaving the block closes the connection: the server stops generating
                    event = parse_sse_line(line, self.url)
                    if event is DONE:
                        return
                    if event is not None:
                        yield event
            except Breach as err:
                raise ServerError(f"the server at {self.url} {err}.") from None

    def _body(self, response: httpx.Response, limit: int, what: str) -> Iterator[bytes]:
        """The body as it arrives, inflated within ``limit`` bytes (a breach is a ServerError)."""
        encoding = response.headers.get("content-encoding")
        try:
            yield from inflated(response.iter_raw(), encoding, limit, what)
        except Breach as err:
            raise ServerError(f"the server at {self.url} {err}.") from None

    def _start_of_body(self, response: httpx.Response) -> bytes:
        """The first :data:`MAX_ERROR_BYTES` of the body (the rest is never read), or nothing
        when it cannot be read."""
        try:
            pieces = self._body(response, MAX_ERROR_BYTES + INFLATE_STEP, "an error body")
            return read_capped(pieces, MAX_ERROR_BYTES)
        except (ServerError, httpx.HTTPError):
            return b""

    def _refuse_redirect(self, response: httpx.Response, path: str) -> None:
        if not 300 <= response.status_code < 400:
            return
        location = server_text(response.headers.get("location", ""), 200) or "no address"
        raise ServerError(
            f"the server at {self.url} redirected {path} to {location} ({response.status_code}): "
            "specchat follows no redirect, so the API key never goes to another address; if you "
            "trust that one, pass it to --server."
        )

    @contextmanager
    def _errors(self, path: str) -> Iterator[None]:
        try:
            yield
        except httpx.ConnectTimeout as err:
            raise ServerError(
                f"cannot connect to {self.url}: no answer within {CONNECT_TIMEOUT:.0f} s."
            ) from err
        except httpx.ConnectError as err:
            raise ServerError(
                f"cannot connect to {self.url}: {_reason(err)}. Is the server running?"
            ) from err
        except httpx.TimeoutException as err:
            raise ServerError(
                f"the server at {self.url} sent nothing for {self.timeout:g} s: it may be overloaded "
                "(raise server_timeout in the config, or SPECCHAT_SERVER_TIMEOUT)."
            ) from err
        except httpx.RemoteProtocolError as err:
            raise ServerError(f"the server at {self.url} closed the connection mid-reply.") from err
        except (httpx.ReadError, httpx.WriteError) as err:
            raise ServerError(f"the server at {self.url} dropped the connection ({_reason(err)}).") from err
        except httpx.HTTPError as err:
            raise ServerError(f"talking to {self.url} failed: {_reason(err)}.") from err

    def _html_answer(self, response: httpx.Response, path: str) -> str:
        """A web page where a stream was due: a proxy's error page or a login portal, usually."""
        start = self._start_of_body(response)[:HTML_PEEK_BYTES]
        said = server_text(_page_text(start.decode("utf-8", "replace")), HTML_SHOWN_CHARS)
        return (
            f"the server at {self.url} answered {path} with an HTML page, not a stream of events "
            f"(a proxy or a web UI in front of the API?); it says: {said or '(nothing)'}"
        )

    def _raise_for_status(self, response: httpx.Response, path: str) -> None:
        if response.status_code < 400:
            return
        detail = _error_message(self._start_of_body(response), _is_html(response))
        code = response.status_code
        if code in (401, 403):
            hint = f"set {API_KEY_ENV} to the server's API key" if code == 401 else "check the API key"
            raise ServerError(f"the server at {self.url} refused the request ({code}{detail}): {hint}.")
        if code == 404:
            raise ServerError(
                f"{self.url}{path} does not exist (404{detail}): is this an OpenAI-compatible server?"
            )
        side = "rejected the request" if code < 500 else "failed"
        raise ServerError(f"the server at {self.url} {side} ({code}{detail}).")


HTML_PEEK_BYTES = 4096
"""Bytes of an HTML answer read to say what it is (a page can be large, and it is not the reply)."""
HTML_SHOWN_CHARS = 160


def _is_html(response: httpx.Response) -> bool:
    return response.headers.get("content-type", "").split(";")[0].strip().lower() in (
        "text/html",
        "application/xhtml+xml",
    )


_TAG = re.compile(r"<(script|style)\b.*?</\1\s*>|<!--.*?-->|<[^>]*>", re.IGNORECASE | re.DOTALL)


def _page_text(html: str) -> str:
    """The words of an HTML page's start, tags dropped and spaces folded (its title comes first)."""
    return " ".join(unescape(_TAG.sub(" ", html)).split())


def _error_message(body: bytes, html: bool) -> str:
    """The server's own explanation, if it sent one (OpenAI, llama-server and vLLM shapes),
    masked, clipped and made visible: it is the server's text, shown on the user's terminal.
    ``body`` is the error body's start (a longer one was cut, so it may not parse)."""
    text = body.decode("utf-8", "replace")
    if html:
        said = _page_text(text[:HTML_PEEK_BYTES])
        return f": an HTML page saying {server_text(said, HTML_SHOWN_CHARS)}" if said else ""
    try:
        data = loads(text, "an error")
    except (ValueError, Breach):
        cut = _MESSAGE_START.search(text)  # an error too long to read whole: its message's start
        if cut is not None:
            return f": {server_text(_unescaped(cut.group(1)).strip(), 200)}"
        first = text.strip().splitlines()
        return f": {server_text(first[0], 160)}" if first else ""
    if isinstance(data, dict):
        error = data.get("error", data)
        message = error.get("message") if isinstance(error, dict) else error
        if message:
            return f": {server_text(str(message).strip(), 200)}"
    return ""


_MESSAGE_START = re.compile(r'"message"\s*:\s*"((?:[^"\\]|\\.)*+)')


def _unescaped(json_string: str) -> str:
    """A JSON string's contents, as far as they decode (a cut one may end mid-escape)."""
    try:
        return str(json.loads(f'"{json_string}"'))
    except ValueError:
        return json_string


def _reason(err: Exception) -> str:
    text = str(err).strip()
    if "refused" in text.lower():
        return "connection refused"
    if "CERTIFICATE_VERIFY_FAILED" in text:
        return "its TLS certificate is not trusted (server_verify_tls = false skips the check)"
    if "name or service not known" in text.lower() or "nodename nor servname" in text.lower():
        return "unknown host name"
    return server_text(text) if text else type(err).__name__  # it may quote what the server sent
