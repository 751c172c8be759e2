"""The field's question files: Spec-Bench's and MT-Bench's ``question.jsonl``.

One JSON object a line, ``{"question_id": 81, "category": "writing", "turns": ["…", "…"]}``;
other fields (MT-Bench's ``reference``) are ignored. Each question becomes a
:class:`~specchat.bench.prompts.BenchPrompt` whose first turn is the user's message and whose
later turns are asked after the method's own answer (:meth:`BenchPrompt.next_turn`). The
messages carry no system prompt: the model's chat template supplies its own, as it does in the
chat.

The file is not trusted: every line is bounded (:data:`MAX_LINE_BYTES`), so is the file
(:data:`MAX_FILE_BYTES`; it is read as every file a user names is, :mod:`specchat.files`: a
device is refused, a pipe that stays silent too), and categories and ids,
which the report prints, must be short and free of control characters. Anything else gets
one line naming the line of the file and what is wrong with it (exit status 2).
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from specchat.bench import BenchError
from specchat.bench.prompt_record import BenchPrompt
from specchat.files import read_user_file
from specchat.untrusted import clipped, visible

MAX_LINE_BYTES = 1 << 20
"""A question line longer than this (1 MiB, hundreds of times Spec-Bench's longest) is refused."""
MAX_FILE_BYTES = 64 << 20
MAX_QUESTIONS = 10_000
MAX_TURNS = 16
MAX_CATEGORY_CHARS = 40
MAX_ID_CHARS = 64
RESERVED_CATEGORIES = frozenset({"all"})
"""Names the report gives its own rows (the overall row is "all")."""
MT_BENCH_CATEGORIES = frozenset(
    {"writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities"}
)
TASKS: dict[str, frozenset[str]] = {"mt_bench": MT_BENCH_CATEGORIES}
"""Spec-Bench's tasks made of several categories: its evaluation (``evaluation/speed.py``)
reports MT-Bench's eight categories together as ``mt_bench``, beside translation,
summarization, qa, math_reasoning and rag."""

FORMAT_HINT = "one JSON object a line with question_id, category and turns, as in Spec-Bench's question.jsonl"


class _LineError(ValueError):
    """What is wrong with one line (the caller adds the file and line number)."""


def read_questions(path: Path) -> list[BenchPrompt]:
    """The questions of ``path`` in file order; the first of each category is its quick prompt."""
    name = clipped(visible(str(path)), 120)
    try:
        data = read_user_file(path, MAX_FILE_BYTES)
    except OSError as err:
        raise BenchError(f"cannot read {name}: {err.strerror or err}.") from err
    return parse_questions(io.BytesIO(data), name)


def parse_questions(stream: IO[bytes], name: str) -> list[BenchPrompt]:
    prompts: list[BenchPrompt] = []
    seen_ids: set[str] = set()
    seen_categories: set[str] = set()
    for number, raw in _lines(stream, name):
        try:
            prompt = _question(raw, first_line=number == 1)
        except _LineError as err:
            raise BenchError(f"{name} line {number}: {err}") from None
        if prompt is None:
            continue
        if prompt.id in seen_ids:
            raise BenchError(f"{name} line {number}: question_id {prompt.id} appears twice.")
        if len(prompts) >= MAX_QUESTIONS:
            raise BenchError(f"{name} holds more than {MAX_QUESTIONS:,} questions: split it.")
        seen_ids.add(prompt.id)
        if prompt.category not in seen_categories:
            seen_categories.add(prompt.category)
            prompt = BenchPrompt(
                prompt.id, prompt.category, prompt.messages, True, prompt.follow_ups, prompt.turn
            )
        prompts.append(prompt)
    if not prompts:
        raise BenchError(f"{name} holds no questions (expected {FORMAT_HINT}).")
    return prompts


def _lines(stream: IO[bytes], name: str) -> Iterator[tuple[int, bytes]]:
    """(line number, line) with both the line and the file bounded, read as they come, so a
    device that never ends (/dev/zero) is refused after one line's worth of bytes."""
    total = 0
    number = 0
    while line := stream.readline(MAX_LINE_BYTES + 1):
        number += 1
        total += len(line)
        if len(line) > MAX_LINE_BYTES:
            raise BenchError(
                f"{name} line {number} is longer than {MAX_LINE_BYTES >> 20} MiB: not a question file "
                f"({FORMAT_HINT})."
            )
        if total > MAX_FILE_BYTES:
            raise BenchError(f"{name} is larger than {MAX_FILE_BYTES >> 20} MiB: not a question file.")
        yield number, line


def _question(raw: bytes, *, first_line: bool) -> BenchPrompt | None:
    """One line as a prompt (None for a blank line)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise _LineError(f"not UTF-8 text (byte {err.start + 1}).") from None
    if first_line:
        text = text.removeprefix("\ufeff")  # a byte-order mark some editors write
    if not text.strip():
        return None
    data = _json_object(text)
    qid = _question_id(data.get("question_id"))
    category = _category(data.get("category"))
    turns = _turns(data.get("turns"))
    return BenchPrompt(qid, category, ({"role": "user", "content": turns[0]},), follow_ups=tuple(turns[1:]))


def _json_object(text: str) -> dict[str, Any]:
    try:
        data = json.loads(text, parse_constant=_no_constant)
    except (ValueError, RecursionError) as err:  # RecursionError: "[[[[…" nested thousands deep
        detail = f" ({clipped(visible(str(err)), 80)})" if isinstance(err, json.JSONDecodeError) else ""
        raise _LineError(f"not valid JSON{detail}; expected {FORMAT_HINT}.") from None
    if not isinstance(data, dict):
        raise _LineError(f"a JSON {type(data).__name__}, not an object; expected {FORMAT_HINT}.")
    return data


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows")


def _question_id(value: object) -> str:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise _LineError(f"question_id must be a whole number or a string ({FORMAT_HINT}).")
    text = str(value)
    if not text.strip() or len(text) > MAX_ID_CHARS or not _printable(text):
        raise _LineError(
            f"question_id must be 1 to {MAX_ID_CHARS} characters without control characters "
            f"(got {_shown(text)})."
        )
    return text


def _category(value: object) -> str:
    if not isinstance(value, str):
        raise _LineError(f"category must be a string ({FORMAT_HINT}).")
    if not value.strip() or len(value) > MAX_CATEGORY_CHARS or not _printable(value):
        raise _LineError(
            f"category must be 1 to {MAX_CATEGORY_CHARS} characters without control characters "
            f"(got {_shown(value)})."
        )
    if "," in value:
        raise _LineError(f"category {_shown(value)} holds a comma, which --categories could not select.")
    if value.strip().lower() in RESERVED_CATEGORIES:
        raise _LineError(f"category {_shown(value)} is the name of the report's overall row.")
    return value.strip()


def _turns(value: object) -> list[str]:
    if not isinstance(value, list) or not value:
        raise _LineError(f"turns must be a list of one or more strings ({FORMAT_HINT}).")
    if len(value) > MAX_TURNS:
        raise _LineError(f"{len(value)} turns: at most {MAX_TURNS} are run.")
    for index, turn in enumerate(value, 1):
        if not isinstance(turn, str) or not turn.strip():
            raise _LineError(f"turn {index} must be a non-empty string.")
        try:
            turn.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate such as "\ud800": no tokenizer takes it
            raise _LineError(f"turn {index} holds an unpaired surrogate (\\u escape), not text.") from None
    return list(value)


def _printable(text: str) -> bool:
    return text.isprintable()


def _shown(text: str) -> str:
    return repr(clipped(visible(text), 60))
