"""One line of a server's event stream, checked before any reader meets it.

A chat-completion chunk is JSON a server wrote: its shape is checked here, where every chunk
passes (a number where text belongs is a malformed chunk: one line), and so are its figures,
as numbers. ``usage`` and llama-server's ``timings`` feed arithmetic and integer conversions
downstream; Python's JSON reader accepts ``NaN``, ``Infinity`` and ``1e400``, so a counter can
be non-finite, negative, fractional or absurd. Such a figure is dropped from the chunk, never
used, and the reply says so once (:func:`drop_bad_figures`), in its own words, not the server's.
"""

from __future__ import annotations

import math
from typing import Any

from specchat.remote.bounded import Breach, loads
from specchat.remote.server_errors import ServerError
from specchat.untrusted import server_text

DONE = object()
"""The ``data: [DONE]`` line that ends a stream."""

TEXT_FIELDS = ("content", "role", "reasoning_content")
"""Fields of a chunk's ``delta`` that every reader takes as text (null or absent is fine)."""
COUNTS = {
    "usage": ("prompt_tokens", "completion_tokens", "total_tokens"),
    "timings": ("prompt_n", "predicted_n", "cache_n", "draft_n", "draft_n_accepted"),
}
"""Counters of tokens: whole numbers from 0 to :data:`MAX_COUNT`."""
DURATIONS = {"timings": ("prompt_ms", "predicted_ms")}
"""Milliseconds: finite, from 0 to :data:`MAX_MS`."""
MAX_COUNT = 10**9
"""More tokens than any context holds, by far."""
MAX_MS = 10**9
"""Eleven days, in milliseconds."""


def parse_sse_line(line: str, server: str) -> Any:
    """One line of a server-sent event stream: a chunk (dict), DONE, or None (comments, blank
    lines, ``event:`` names, JSON that is not an object). ServerError for what cannot be read."""
    if not line.startswith("data:"):
        return None
    payload = line[len("data:") :].strip()
    if payload == "[DONE]":
        return DONE
    if not payload:
        return None
    try:
        data = loads(payload, "a chunk")
    except Breach as err:
        raise ServerError(f"the server at {server} {err}.") from None
    except (ValueError, RecursionError) as err:
        raise ServerError(f"the server sent something that is not JSON: {server_text(payload, 80)}") from err
    if isinstance(data, dict) and "error" in data and "choices" not in data:
        error = data["error"]
        message = error.get("message") if isinstance(error, dict) else error
        raise ServerError(f"the server reported an error mid-reply: {server_text(message)}")
    if not isinstance(data, dict):
        return None
    problem = chunk_problem(data)
    if problem is not None:
        raise ServerError(f"the server sent a malformed chunk: {problem}.")
    return data


def chunk_problem(data: dict[str, Any]) -> str | None:
    """Why a chat-completion chunk cannot be read as one (None: it can)."""
    choices = data.get("choices")
    if choices is not None and not isinstance(choices, list):
        return f"`choices` is {kind_of(choices)}, not a list"
    for choice in choices or []:
        problem = _choice_problem(choice)
        if problem is not None:
            return problem
    for section, names in (*COUNTS.items(), *DURATIONS.items()):
        counters = data.get(section)
        if not isinstance(counters, dict):
            continue  # the readers skip a section that is not an object
        for name in names:
            value = counters.get(name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
                return f"`{section}.{name}` is {kind_of(value)}, not a number"
    return None


def _choice_problem(choice: object) -> str | None:
    if not isinstance(choice, dict):
        return f"a choice is {kind_of(choice)}, not an object"
    finish = choice.get("finish_reason")
    if finish is not None and not isinstance(finish, str):
        return f"`finish_reason` is {kind_of(finish)}, not text"
    delta = choice.get("delta")
    if delta is None:
        return None
    if not isinstance(delta, dict):
        return f"`delta` is {kind_of(delta)}, not an object"
    for name in TEXT_FIELDS:
        value = delta.get(name)
        if value is not None and not isinstance(value, str):
            return f"`{name}` is {kind_of(value)}, not text"
    logprobs = choice.get("logprobs")
    if logprobs is not None and not isinstance(logprobs, dict):
        return f"`logprobs` is {kind_of(logprobs)}, not an object"
    return None


def kind_of(value: object) -> str:
    """What a JSON value is, in words (its text is the server's, so it is not quoted here)."""
    kinds = {bool: "true/false", int: "a number", float: "a number", str: "text", list: "a list"}
    return kinds.get(type(value), "an object" if isinstance(value, dict) else "null")


def drop_bad_figures(data: dict[str, Any]) -> list[str]:
    """Remove from ``data`` every counter that is not a sane number (its type was checked by
    :func:`chunk_problem`); one notice per figure removed, naming it and what was wrong."""
    notices: list[str] = []
    for sections, check in ((COUNTS, _count_problem), (DURATIONS, _duration_problem)):
        for section, names in sections.items():
            counters = data.get(section)
            if not isinstance(counters, dict):
                continue
            for name in names:
                value = counters.get(name)
                problem = None if value is None else check(value)
                if problem is not None:
                    del counters[name]
                    notices.append(f"the server reported {problem} {section}.{name}: not used")
                elif isinstance(value, float) and check is _count_problem:
                    counters[name] = int(value)
    return notices


def _count_problem(value: float) -> str | None:
    if not math.isfinite(value):
        return "a non-finite"
    if value < 0 or value > MAX_COUNT:
        return "an out-of-range"
    if value != int(value):
        return "a fractional"
    return None


def _duration_problem(value: float) -> str | None:
    if not math.isfinite(value):
        return "a non-finite"
    if value < 0 or value > MAX_MS:
        return "an out-of-range"
    return None
