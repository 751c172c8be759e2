"""Reading what a server sends within stated bounds, whatever it sends.

A server is input like any file: it may compress a gigabyte into a megabyte, send a line that
never ends, or nest JSON a hundred thousand deep. Everything the client reads passes through
here, and each bound is a named figure, breached with one line (:class:`Breach`):

- the body is inflated as it streams, :data:`INFLATE_STEP` bytes at a time, and reading stops
  once a body's cap is passed: a bomb never inflates past the cap plus one step;
- a server-sent-events stream is split into lines of at most :data:`MAX_LINE_BYTES`;
- a document (``/v1/models``, ``/props``, ``/slots``, ``/metrics``) is at most
  :data:`MAX_DOCUMENT_BYTES`, and of an error body only the first :data:`MAX_ERROR_BYTES` are
  read (one line quotes 200 characters of it);
- JSON is parsed only when nested at most :data:`MAX_JSON_DEPTH` deep (Python's parser recurses).

Only the encodings the client asks for are read (gzip and deflate, or none): another one is
refused rather than handed to a decoder without a cap. Pure Python, no I/O of its own.
"""

from __future__ import annotations

import json
import re
import zlib
from collections.abc import Iterable, Iterator
from typing import Any, Protocol

MiB = 1024 * 1024
MAX_LINE_BYTES = 1 * MiB
"""One line of a reply's stream: a chunk is a few hundred bytes, a few kB with logprobs."""
MAX_DOCUMENT_BYTES = 8 * MiB
"""One document a server serves beside the stream; a vLLM /metrics is tens of kB."""
MAX_ERROR_BYTES = 64 * 1024
"""What is read of an error body or an HTML page: only its start is ever shown."""
MAX_JSON_DEPTH = 32
"""A chat-completion chunk nests 5 deep, a /v1/models or /props document under 10."""
INFLATE_STEP = 64 * 1024
"""Bytes inflated at a time: the most a compressed body can hold in memory past its cap."""
ACCEPTED_ENCODINGS = "gzip, deflate"
"""What the client asks for: the encodings it inflates itself, within the caps."""


class Breach(Exception):
    """A bound was passed; the message says which, in words that follow "the server … ".

    The client turns it into a ServerError naming the server.
    """


class _Decoder(Protocol):
    def feed(self, data: bytes) -> Iterator[bytes]: ...


class _Identity:
    def feed(self, data: bytes) -> Iterator[bytes]:
        if data:
            yield data


class _Inflate:
    """zlib's inflate, asked for at most :data:`INFLATE_STEP` bytes at a time."""

    def __init__(self, wbits: int, *, fallback_raw: bool = False) -> None:
        self._inflate = zlib.decompressobj(wbits)
        self._fallback_raw = fallback_raw
        self._started = False

    def feed(self, data: bytes) -> Iterator[bytes]:
        pending = data
        while True:
            try:
                out = self._inflate.decompress(pending, INFLATE_STEP)
            except zlib.error as err:
                if self._fallback_raw and not self._started:
                    # "deflate" is meant to be zlib-wrapped, but servers send raw deflate too.
                    self._inflate, self._fallback_raw = zlib.decompressobj(-zlib.MAX_WBITS), False
                    continue
                raise Breach(f"sent a compressed body that does not inflate ({err})") from None
            self._started = True
            if out:
                yield out
            pending = self._inflate.unconsumed_tail
            if not pending and len(out) < INFLATE_STEP:
                return


def _decoder(name: str) -> _Decoder:
    if name in ("", "identity"):
        return _Identity()
    if name in ("gzip", "x-gzip"):
        return _Inflate(16 + zlib.MAX_WBITS)
    if name == "deflate":
        return _Inflate(zlib.MAX_WBITS, fallback_raw=True)
    raise Breach(
        f"compressed its answer with {name[:40]!r}, which specchat did not ask for and does not read "
        f"(it asks for {ACCEPTED_ENCODINGS})"
    )


def inflated(raw: Iterable[bytes], content_encoding: str | None, limit: int, what: str) -> Iterator[bytes]:
    """The body ``raw`` decoded as its ``Content-Encoding`` says, piece by piece, raising
    :class:`Breach` once more than ``limit`` decoded bytes arrive (``what`` names the body)."""
    names = [part.strip().lower() for part in (content_encoding or "").split(",") if part.strip()]
    if len(names) > 2:
        raise Breach(f"stacked {len(names)} encodings on its answer; specchat reads at most two")
    decoders = [_decoder(name) for name in reversed(names)]
    total = 0
    for data in raw:
        for piece in _through(decoders, data):
            total += len(piece)
            if total > limit:
                raise Breach(
                    f"sent {what} of more than {_size(limit)} (decoded); specchat stops reading there"
                )
            yield piece


def _through(decoders: list[_Decoder], data: bytes) -> Iterator[bytes]:
    if not decoders:
        if data:
            yield data
        return
    first, rest = decoders[0], decoders[1:]
    for piece in first.feed(data):
        yield from _through(rest, piece)


def read_capped(pieces: Iterable[bytes], limit: int) -> bytes:
    """The first ``limit`` bytes of ``pieces`` (the rest is not read): an error body's start."""
    parts: list[bytes] = []
    total = 0
    for piece in pieces:
        parts.append(piece[: limit - total])
        total += len(parts[-1])
        if total >= limit:
            break
    return b"".join(parts)


_LINE_BREAK = re.compile(b"\r\n|\r|\n")


def lines(pieces: Iterable[bytes], limit: int = MAX_LINE_BYTES) -> Iterator[str]:
    """Text lines of a server-sent-events stream (CR, LF or CRLF end a line), each at most
    ``limit`` bytes: a longer one raises :class:`Breach` before it is held whole. Only a new
    piece is searched for line breaks, so a line that arrives a byte at a time costs linear time.
    """
    pending: list[bytes] = []
    size = 0
    for piece in pieces:
        start = 0
        for match in _LINE_BREAK.finditer(piece):
            pending.append(piece[start : match.start()])
            yield b"".join(pending).decode("utf-8", "replace")
            pending, size, start = [], 0, match.end()
        rest = piece[start:]
        if rest:
            size += len(rest)
            if size > limit:
                raise Breach(f"sent a line of more than {_size(limit)} without a line break")
            pending.append(rest)
    if pending:
        yield b"".join(pending).decode("utf-8", "replace")


_NESTING = re.compile(r'"(?:[^"\\]|\\.)*+"|[\[\]{}]')
"""A JSON string (skipped whole, possessively: no backtracking on an unclosed one) or a bracket."""


def nested_too_deep(text: str, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether the JSON in ``text`` opens more than ``limit`` arrays or objects inside each other."""
    if text.count("[") + text.count("{") <= limit:
        return False  # the common case, in two passes of C
    depth = 0
    for match in _NESTING.finditer(text):
        char = match.group()
        if char in "[{":
            depth += 1
            if depth > limit:
                return True
        elif char in "]}":
            depth -= 1
    return False


def loads(text: str, what: str) -> Any:
    """JSON from a server, depth-checked first (:class:`Breach`); ValueError when it is not JSON.

    ``NaN`` and ``Infinity``, which Python's parser accepts, parse as floats: the figures'
    checks (:mod:`specchat.remote.figures`) drop them.
    """
    if nested_too_deep(text):
        raise Breach(f"sent {what} nested more than {MAX_JSON_DEPTH} deep")
    return json.loads(text)


def _size(count: int) -> str:
    return f"{count // MiB} MiB" if count >= MiB and count % MiB == 0 else f"{count // 1024} KiB"
