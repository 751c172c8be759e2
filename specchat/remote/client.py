"""The HTTP side: one httpx client per server, errors turned into one line each.

Server-sent events are read line by line from a streamed response (``data: {...}`` lines,
``data: [DONE]`` at the end). A watcher thread closes the response as soon as the cancel
event is set, so Esc stops a reply even while the server is still prefilling and sends nothing.
"""

from __future__ import annotations

import json
import os
import queue
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from html import unescape
from typing import Any
from urllib.parse import urlsplit

import httpx

from specchat.remote.server_errors import ServerError
from specchat.untrusted import remember_secret, server_text

API_KEY_ENV = "SPECCHAT_API_KEY"
"""The only place the API key comes from: never a flag (shell history), never the config file."""
CONNECT_TIMEOUT = 10.0
CANCEL_POLL = 0.05
"""Seconds between looks at the cancel flag while waiting for the server."""
DEFAULT_TIMEOUT = 120.0
"""Seconds without a byte from the server before a reply fails (a big prompt on a slow server
may take this long to prefill)."""


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


class ServerClient:
    """GET and streamed POST against one server, every failure a ServerError with one line."""

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
        headers = {"Accept": "application/json"}
        if api_key:
            remember_secret(api_key)  # a server that echoes it back must never get it shown
            headers["Authorization"] = f"Bearer {api_key}"
        self._options: dict[str, Any] = {
            "base_url": self.url,
            "headers": headers,
            "timeout": httpx.Timeout(timeout, connect=min(CONNECT_TIMEOUT, timeout)),
            "verify": verify,  # TLS certificates are checked unless the user turns it off
            "transport": transport,
            "follow_redirects": False,
        }
        self._client = httpx.Client(**self._options)
        self.timeout = timeout

    def close(self) -> None:
        self._client.close()

    def get_json(self, path: str) -> Any:
        """A JSON document, or None when the server has no such endpoint (404/405/501)."""
        with self._errors(path):
            response = self._client.get(path)
        if response.status_code in (404, 405, 501):
            return None
        self._raise_for_status(response, path)
        try:
            return response.json()
        except ValueError:
            return None

    def get_text(self, path: str) -> str | None:
        """A text document, or None when the server has no such endpoint or refuses it."""
        with self._errors(path):
            response = self._client.get(path)
        if response.status_code >= 400:
            return None
        return response.text

    def stream_events(
        self, path: str, body: dict[str, Any], cancel: threading.Event | None = None
    ) -> Iterator[dict[str, Any]]:
        """POST ``body`` and yield each server-sent event's JSON, until ``[DONE]`` or the end.

        Returns within a poll interval once ``cancel`` is set, even while the server is still
        prefilling and sends nothing: the request runs in a reader thread, which closes the
        connection (so the server stops) as soon as it next hears from it. A stream that ends
        without a finish reason is the caller's to judge (some servers omit ``[DONE]``); a
        connection cut mid-body raises ServerError.
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
        try:
            while True:
                try:
                    kind, item = inbox.get(timeout=CANCEL_POLL)
                except queue.Empty:
                    if cancel is not None and cancel.is_set():
                        return
                    continue
                if cancel is not None and cancel.is_set():
                    return
                if kind == "end":
                    return
                if kind == "error":
                    raise item
                yield item
        finally:
            stop.set()

    def _read_events(
        self, path: str, body: dict[str, Any], stop: threading.Event
    ) -> Iterator[dict[str, Any]]:
        with self._errors(path), self._client.stream("POST", path, json=body) as response:
            if response.status_code >= 400:
                response.read()
                self._raise_for_status(response, path)
            if _is_html(response):
                raise ServerError(self._html_answer(response, path))
            for line in response.iter_lines():
                if stop.is_set():
                    return  # leaving the block closes the connection: the server stops generating
                event = _parse_sse_line(line)
                if event is _DONE:
                    return
                if event is not None:
                    yield event

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
        start = b""
        for piece in response.iter_bytes():
            start += piece
            if len(start) >= HTML_PEEK_BYTES:
                break
        said = server_text(_page_text(start[:HTML_PEEK_BYTES].decode("utf-8", "replace")), HTML_SHOWN_CHARS)
        return (
            f"the server at {self.url} answered {path} with an HTML page, not a stream of events "
            f"(a proxy or a web UI in front of the API?); it says: {said or '(nothing)'}"
        )

    def _raise_for_status(self, response: httpx.Response, path: str) -> None:
        if response.status_code < 400:
            return
        detail = _error_message(response)
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


_DONE = object()


def _parse_sse_line(line: str) -> Any:
    """One line of a server-sent event stream: a dict, _DONE, or None (comments, blank lines)."""
    if not line.startswith("data:"):
        return None  # blank separators, ": keep-alive" comments, "event:" names
    payload = line[len("data:") :].strip()
    if payload == "[DONE]":
        return _DONE
    if not payload:
        return None
    try:
        data = json.loads(payload)
    except ValueError as err:
        raise ServerError(f"the server sent something that is not JSON: {server_text(payload, 80)}") from err
    if isinstance(data, dict) and "error" in data and "choices" not in data:
        error = data["error"]
        message = error.get("message") if isinstance(error, dict) else error
        raise ServerError(f"the server reported an error mid-reply: {server_text(message)}")
    if not isinstance(data, dict):
        return None
    problem = _chunk_problem(data)
    if problem is not None:
        raise ServerError(f"the server sent a malformed chunk: {problem}.")
    return data


_TEXT_FIELDS = ("content", "role", "reasoning_content")
"""Fields of a chunk's ``delta`` that every reader takes as text (null or absent is fine)."""
_NUMBER_FIELDS = {
    "usage": ("prompt_tokens", "completion_tokens", "total_tokens"),
    "timings": (
        *("prompt_n", "prompt_ms", "predicted_n", "predicted_ms", "cache_n"),
        *("draft_n", "draft_n_accepted"),
    ),
}
"""Counters the readers do arithmetic with (llama-server's ``timings``, the OpenAI ``usage``)."""


def _chunk_problem(data: dict[str, Any]) -> str | None:
    """Why a chat-completion chunk cannot be read as one (None: it can).

    Checked here, where every chunk passes, so that no reader downstream meets a number where
    text belongs (and fails with a TypeError instead of saying what the server sent).
    """
    choices = data.get("choices")
    if choices is not None and not isinstance(choices, list):
        return f"`choices` is {_kind_of(choices)}, not a list"
    for choice in choices or []:
        if not isinstance(choice, dict):
            return f"a choice is {_kind_of(choice)}, not an object"
        finish = choice.get("finish_reason")
        if finish is not None and not isinstance(finish, str):
            return f"`finish_reason` is {_kind_of(finish)}, not text"
        delta = choice.get("delta")
        if delta is None:
            continue
        if not isinstance(delta, dict):
            return f"`delta` is {_kind_of(delta)}, not an object"
        for name in _TEXT_FIELDS:
            value = delta.get(name)
            if value is not None and not isinstance(value, str):
                return f"`{name}` is {_kind_of(value)}, not text"
        logprobs = choice.get("logprobs")
        if logprobs is not None and not isinstance(logprobs, dict):
            return f"`logprobs` is {_kind_of(logprobs)}, not an object"
    for section, names in _NUMBER_FIELDS.items():
        counters = data.get(section)
        if not isinstance(counters, dict):
            continue  # the readers skip a section that is not an object
        for name in names:
            value = counters.get(name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
                return f"`{section}.{name}` is {_kind_of(value)}, not a number"
    return None


def _kind_of(value: object) -> str:
    """What a JSON value is, in words (its text is the server's, so it is not quoted here)."""
    kinds = {bool: "true/false", int: "a number", float: "a number", str: "text", list: "a list"}
    return kinds.get(type(value), "an object" if isinstance(value, dict) else "null")


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


def _error_message(response: httpx.Response) -> str:
    """The server's own explanation, if it sent one (OpenAI, llama-server and vLLM shapes),
    masked, clipped and made visible: it is the server's text, shown on the user's terminal."""
    if _is_html(response):
        said = _page_text(response.text[:HTML_PEEK_BYTES])
        return f": an HTML page saying {server_text(said, HTML_SHOWN_CHARS)}" if said else ""
    try:
        data = response.json()
    except ValueError:
        text = response.text.strip().splitlines()
        return f": {server_text(text[0], 160)}" if text else ""
    if isinstance(data, dict):
        error = data.get("error", data)
        message = error.get("message") if isinstance(error, dict) else error
        if message:
            return f": {server_text(str(message).strip(), 200)}"
    return ""


def _reason(err: Exception) -> str:
    text = str(err).strip()
    if "refused" in text.lower():
        return "connection refused"
    if "CERTIFICATE_VERIFY_FAILED" in text:
        return "its TLS certificate is not trusted (server_verify_tls = false skips the check)"
    if "name or service not known" in text.lower() or "nodename nor servname" in text.lower():
        return "unknown host name"
    return server_text(text) if text else type(err).__name__  # it may quote what the server sent
