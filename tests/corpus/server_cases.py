"""The hostile-server corpus: each case a misbehaving server (tests/corpus/hostile_server.py) and
what ``specchat generate`` must make of it.

The rule every case keeps (tests/corpus/test_hostile_servers.py): exit status 2 with one line
naming what the server did, or, where the reply is still what was asked for (a figure dropped, a
token limit the server ignored), status 0 with a note; no traceback; within 60 s and 2 GB; what
arrived is printed; no raw control, bidi or zero-width character in anything printed.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

from tests.corpus.hostile_server import (
    Answer,
    bomb,
    chunk,
    document,
    dribbled_models,
    echo_key,
    endless_line,
    endless_tokens,
    error,
    keepalive,
    models,
    redirect,
    reply,
    stream,
)

MODELS = "GET /v1/models"
CHAT = "POST /v1/chat/completions"
QUICK_TIMEOUT = {"SPECCHAT_SERVER_TIMEOUT": "3"}
"""The time cases stall after 3 s, not the default 60 (checked by hand: see the closing note)."""
BIDI = "\u202e"
ZERO_WIDTH = "\u200b"
DEEP = "[" * 100_000 + "]" * 100_000

CLASSES = {
    "memory": "unbounded memory: a gzip bomb, an endless line, body or document, deep JSON",
    "time": "an endless hang: one byte a second, keep-alive comments, a dribbled /v1/models",
    "tokens": "--max-new-tokens not enforced against a server",
    "figures": "figures that crash: NaN, Infinity, 1e30, negative or fractional counters",
    "text": "text that rearranges itself: bidi and zero-width characters",
    "fifo": "a FIFO with no writer as a prompt file",
    "tags": "reasoning tags split across chunks, repeated or stray",
    "secrets": "an API key shorter than 4 characters",
    "redirects": "a redirect named as something else",
}


@dataclass(frozen=True)
class ServerCase:
    name: str
    klass: str
    routes: dict[str, Answer]
    status: int = 2
    words: tuple[str, ...] = ()
    """In the last line (status 2), or in stderr (status 0: the notes)."""
    printed: str | None = None
    """What stdout must start with: the reply that arrived (kept)."""
    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    absent: tuple[str, ...] = ()
    """Text that must appear nowhere in what is printed (a key, a tag's fragment)."""


def _served(name: str, klass: str, chat: Answer, **kw: object) -> ServerCase:
    return ServerCase(name, klass, {MODELS: models(), CHAT: chat}, **kw)  # type: ignore[arg-type]


def _llama(name: str, klass: str, chat: Answer, **kw: object) -> ServerCase:
    """A server that says it is llama-server (its counters are read)."""
    return ServerCase(name, klass, {MODELS: models(owner="llamacpp"), CHAT: chat}, **kw)  # type: ignore[arg-type]


def _timings(n: float, **extra: float) -> dict[str, float]:
    return {"prompt_n": 3, "prompt_ms": 5.0, "predicted_n": n, "predicted_ms": 10.0 * n, **extra}


NAN, INF = math.nan, math.inf

CASES: list[ServerCase] = [
    # memory
    _served(
        "gzip bomb as the reply", "memory", bomb(200, "text/event-stream"), words=("without a line break",)
    ),
    _served("gzip bomb as an error", "memory", bomb(500, "application/json"), words=("failed (500",)),
    ServerCase(
        "gzip bomb as /v1/models",
        "memory",
        {MODELS: bomb(200, "application/json")},
        words=("sent /v1/models of more than 8 MiB",),
    ),
    _served("a reply line that never ends", "memory", endless_line(), words=("1 MiB without a line break",)),
    _served(
        "an error body that never ends", "memory", endless_line(500, "text/plain"), words=("failed (500",)
    ),
    ServerCase(
        "a /v1/models that never ends",
        "memory",
        {MODELS: endless_line(200, "application/json")},
        words=("sent /v1/models of more than 8 MiB",),
    ),
    _served("a chunk nested 100,000 deep", "memory", stream([DEEP]), words=("nested more than 32 deep",)),
    ServerCase(
        "a /v1/models nested 100,000 deep",
        "memory",
        {MODELS: document(DEEP)},
        words=("nested more than 32 deep",),
    ),
    _served(
        "text no token count can hold",
        "memory",
        reply(["x" * 200_000, "y"]),
        words=("more text than 8 tokens can hold",),
    ),
    # time
    _served(
        "one byte a second after a token",
        "time",
        keepalive(["Hi"], b"x", 1.0),
        env=QUICK_TIMEOUT,
        words=("has sent no new token for 3 s", "Gave up"),
        printed="Hi",
    ),
    _served(
        "keep-alive comments after a token",
        "time",
        keepalive(["Hi"], b": ping\n\n", 0.3),
        env=QUICK_TIMEOUT,
        words=("has sent no new token for 3 s",),
        printed="Hi",
    ),
    _served(
        "empty chunks after a token",
        "time",
        keepalive(["Hi"], f"data: {chunk()}\n\n".encode(), 0.3),
        env=QUICK_TIMEOUT,
        words=("has sent no new token for 3 s",),
        printed="Hi",
    ),
    _served(
        "keep-alive comments and no token",
        "time",
        keepalive([], b": ping\n\n", 0.3),
        env=QUICK_TIMEOUT,
        words=("has sent no token for 3 s",),
    ),
    ServerCase(
        "a /v1/models one byte at a time",
        "time",
        {MODELS: dribbled_models(0.3)},
        env=QUICK_TIMEOUT,
        words=("took more than 3 s to say what it is",),
    ),
    # tokens
    _served(
        "a server that ignores max_tokens",
        "tokens",
        endless_tokens(),
        status=0,
        args=("--max-new-tokens", "5"),
        printed=" word" * 5,
        words=("went on past max_tokens (5)",),
    ),
    _llama(
        "a token count that jumps by a billion",
        "tokens",
        stream([chunk("a", timings=_timings(1)), chunk("b", timings=_timings(10**9)), chunk(finish="stop")]),
        status=0,
        args=("--max-new-tokens", "5"),
        words=("went on past max_tokens (5)",),
        printed="a",
    ),
    # figures
    _served(
        "NaN, Infinity and 1e30 in usage",
        "figures",
        reply(["Hello"], usage={"prompt_tokens": NAN, "completion_tokens": INF, "total_tokens": 1e30}),
        status=0,
        printed="Hello",
        words=("non-finite usage.prompt_tokens", "non-finite usage.completion_tokens", "out-of-range usage"),
    ),
    _llama(
        "NaN and Infinity in timings",
        "figures",
        stream(
            [
                chunk("Hel", timings=_timings(1)),
                chunk("lo", finish="stop", timings=_timings(INF, predicted_ms=NAN)),
            ]
        ),
        status=0,
        printed="Hello",
        words=("non-finite timings.predicted_n", "non-finite timings.predicted_ms"),
    ),
    _llama(
        "10^30, negative and fractional timings",
        "figures",
        stream(
            [
                chunk("Hel", timings=_timings(1, prompt_n=10**30)),
                chunk("lo", finish="stop", timings=_timings(2, prompt_ms=-5.0, cache_n=1.5)),
            ]
        ),
        status=0,
        printed="Hello",
        words=(
            "out-of-range timings.prompt_n",
            "out-of-range timings.prompt_ms",
            "fractional timings.cache_n",
        ),
    ),
    _llama(
        "a decode time of a picosecond",
        "figures",
        stream(
            [
                chunk("Hel", timings=_timings(1)),
                chunk("lo", finish="stop", timings=_timings(2, predicted_ms=1e-9)),
            ]
        ),
        status=0,
        printed="Hello",
        words=("implausible timings.predicted_ms",),
    ),
    # text
    _served(
        "bidi and zero-width characters in the reply",
        "text",
        reply(["safe ", f"{BIDI}evil", f"{ZERO_WIDTH}x", "\u2066y\u2069"]),
        status=0,
        printed="safe ⟨U+202E⟩evil⟨U+200B⟩x⟨U+2066⟩y⟨U+2069⟩",
    ),
    _served(
        "bidi characters in the reply, as JSON lines",
        "text",
        reply([f"{BIDI}evil"]),
        status=0,
        args=("--format", "jsonl"),
    ),
    _served(
        "bidi characters in the reply, coloured",
        "text",
        reply([f"{BIDI}evil"]),
        status=0,
        args=("--format", "ansi"),
        words=(),
    ),
    ServerCase(
        "a bidi model id",
        "text",
        {MODELS: models(f"m{BIDI}di"), CHAT: reply(["ok"])},
        status=0,
        words=("m⟨U+202E⟩di",),
        printed="ok",
    ),
    _served(
        "a bidi server error",
        "text",
        error(500, f"boom {BIDI}txet"),
        words=("boom ⟨U+202E⟩txet",),
    ),
    # tags
    _served(
        "a tag split across chunks",
        "tags",
        reply(["<th", "ink>", "hmm", "</th", "ink>", "\n\n", "Answer"]),
        status=0,
        printed="Answer",
        absent=("<th", "ink>"),
    ),
    _served(
        "a repeated <think>",
        "tags",
        reply(["<think>", "<think>", "hmm", "</think>", "</think>", "Answer"]),
        status=0,
        printed="Answer",
        absent=("think>",),
    ),
    _served(
        "a stray </think>",
        "tags",
        reply(["Hello", "</think>", " world"]),
        status=0,
        printed="Hello world",
        absent=("think>",),
    ),
    # secrets
    ServerCase(
        "a 2-character key echoed in a 401",
        "secrets",
        {MODELS: echo_key(401)},
        env={"SPECCHAT_API_KEY": "k9"},
        words=("bad key Bearer *** (***)",),
        absent=("k9",),
    ),
    ServerCase(
        "a 3-character key echoed mid-reply",
        "secrets",
        {MODELS: models(), CHAT: echo_key(403)},
        env={"SPECCHAT_API_KEY": "Zq7"},
        words=("bad key Bearer *** (***)",),
        absent=("Zq7",),
    ),
    # redirects
    ServerCase(
        "/v1/models redirected",
        "redirects",
        {MODELS: redirect("http://127.0.0.1:9/elsewhere/v1/models")},
        words=(
            "redirected /v1/models to http://127.0.0.1:9/elsewhere/v1/models (307)",
            "follows no redirect",
        ),
    ),
    _served(
        "the reply redirected",
        "redirects",
        redirect("https://127.0.0.1:9/v1/chat/completions", 302),
        words=("redirected /v1/chat/completions", "(302)"),
    ),
]


FIFO_CASES = {
    "generate --prompt-file on a FIFO with no writer": ("generate", "--prompt-file"),
    "bench --prompts on a FIFO with no writer": ("bench", "--prompts"),
}
"""The FIFO class: run beside the server cases, each with a FIFO of its own."""


def payload_of_jsonl(stdout: str) -> str:
    """The reply's text from ``--format jsonl`` output."""
    events = [json.loads(line) for line in stdout.splitlines() if line.strip()]
    return "".join(e["text"] for e in events if e.get("type") == "token")
