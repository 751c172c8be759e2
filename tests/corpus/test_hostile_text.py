"""The bad-input corpus, hostile text: what a server sends to `specchat generate --server`.

Every case runs against a loopback server that may echo the API key it is sent. Whatever the
server does, specchat writes no control byte to the terminal (stdout or stderr) in text mode,
never shows the key, cuts long strings, and answers a bad server with one clear line and exit
status 2, leaving the user's saved files as they were.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

import pytest
from click.testing import CliRunner

from specchat.cli import main
from tests.remote.server import Script, openai_stream
from tests.remote.test_hostile_server import (
    AUTH,
    CONTROL_BYTES,
    HOSTILE_PIECES,
    KEY,
    RAW_KEY,
    HostileServer,
)

from .conftest import AlreadySaved, assert_one_clear_line

USER_ERROR = 2


def server(pieces: list[str] | None = None, model: str = "gpt-test") -> Script:
    models = json.dumps({"object": "list", "data": [{"id": model, "object": "model", "owned_by": "x"}]})
    return Script(
        documents={"/v1/models": (200, "application/json", models)}, stream=openai_stream(pieces or ["ok"])
    )


def failing(status: int, body: str) -> Script:
    script = server()
    script.status, script.error_body = status, body
    return script


def with_chunk(chunk: dict[str, object] | str) -> Script:
    script = server(["fine"])
    script.stream.insert(2, chunk if isinstance(chunk, str) else json.dumps(chunk))
    return script


def models_answer(status: int, body: str) -> Script:
    script = server()
    script.documents["/v1/models"] = (status, "application/json", body)
    return script


@dataclass(frozen=True)
class Case:
    script: Callable[[], Script]
    words: tuple[str, ...] = ()
    """Words the one error line must hold (none: the reply succeeds)."""
    status: int = USER_ERROR
    output_format: str = "text"
    html: str | None = None
    """Answer the chat request with this HTML page (200 text/html)."""
    text_errors: bool = False


ESCAPES = "\x1b[2J\x1b]0;pwned\x07\x9b1m"
CASES: dict[str, Case] = {
    # item 1: escape sequences in what the server says
    "reply with escapes, text": Case(lambda: server(HOSTILE_PIECES), status=0),
    "reply with escapes, jsonl": Case(lambda: server(HOSTILE_PIECES), status=0, output_format="jsonl"),
    "model id with escapes": Case(lambda: server(model=f"m{ESCAPES}"), status=0),
    "error message with escapes": Case(
        lambda: failing(500, json.dumps({"error": {"message": f"boom{ESCAPES}"}})), ("500", "boom^[[2J")
    ),
    "not JSON, with escapes": Case(lambda: with_chunk(f"nonsense{ESCAPES}"), ("not JSON", "^[[2J")),
    # item 2: the key echoed back
    "401 JSON echoing the bearer": Case(
        lambda: failing(401, json.dumps({"error": {"message": f"key {AUTH} is invalid"}})),
        ("401", "Bearer ***", "SPECCHAT_API_KEY"),
    ),
    "400 plain text echoing the key": Case(
        lambda: failing(400, f"bad request from {RAW_KEY}"), ("400", "from ***"), text_errors=True
    ),
    "models 401 echoing the key": Case(
        lambda: models_answer(401, json.dumps({"error": f"who is {RAW_KEY}?"})), ("401", "who is ***?")
    ),
    "SSE error echoing the key": Case(
        lambda: with_chunk({"error": {"message": f"quota for {AUTH}"}}), ("mid-reply", "quota for Bearer ***")
    ),
    "not JSON echoing the key": Case(lambda: with_chunk(f"{{broken {RAW_KEY}"), ("not JSON", "***")),
    # item 4: strings without limits
    "5 MB model id": Case(lambda: server(model="m" * 5_000_000), status=0),
    "1 MB error message": Case(
        lambda: failing(500, json.dumps({"error": {"message": "x" * 1_000_000}})), ("500", "more characters")
    ),
    "1 MB plain-text error": Case(lambda: failing(400, "y" * 1_000_000), ("400",), text_errors=True),
    # item 11: chunks of the wrong shape
    "content a number": Case(
        lambda: with_chunk({"choices": [{"delta": {"content": 42}}]}), ("malformed", "`content` is a number")
    ),
    "content a list": Case(
        lambda: with_chunk({"choices": [{"delta": {"content": ["a"]}}]}), ("malformed", "`content` is a list")
    ),
    "content an object": Case(
        lambda: with_chunk({"choices": [{"delta": {"content": {"t": 1}}}]}), ("`content` is an object",)
    ),
    "finish reason a list": Case(
        lambda: with_chunk({"choices": [{"delta": {}, "finish_reason": ["stop"]}]}), ("`finish_reason`",)
    ),
    "choices an object": Case(lambda: with_chunk({"choices": {"0": {}}}), ("`choices` is an object",)),
    "usage tokens as text": Case(
        lambda: with_chunk({"choices": [], "usage": {"completion_tokens": "9"}}),
        ("`usage.completion_tokens`",),
    ),
    # item 12: an HTML page
    "200 text/html": Case(
        server,
        ("HTML page", "it says: 502 Bad Gateway"),
        html="<html><head><title>502 Bad Gateway</title></head><body>nginx</body></html>",
    ),
    "200 text/html with escapes": Case(
        server, ("HTML page", "^[]0;pwned^G"), html=f"<html><title>login{ESCAPES}</title></html>"
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_a_hostile_server_is_shown_safely_and_loses_nothing(
    name: str, already_saved: AlreadySaved, monkeypatch: pytest.MonkeyPatch
) -> None:
    case = CASES[name]
    monkeypatch.setenv("SPECCHAT_API_KEY", KEY)
    with HostileServer(case.script(), html=case.html, text_errors=case.text_errors) as fake:
        result = CliRunner().invoke(
            main, ["generate", "hi", "--server", fake.url, "--format", case.output_format]
        )
    assert result.exit_code == case.status, result.output[-2000:]
    assert CONTROL_BYTES.search(result.stdout_bytes) is None, result.stdout_bytes[-500:]
    assert CONTROL_BYTES.search(result.stderr_bytes) is None, result.stderr[-500:]
    assert KEY not in result.output and KEY[:10] not in result.output
    assert len(result.stderr) < 3_000
    if case.words:
        assert_one_clear_line(result.stderr, *case.words)
    already_saved.assert_untouched()
