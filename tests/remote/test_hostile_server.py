"""A misbehaving or hostile server, against `specchat generate`.

What a server sends is not trusted: escape sequences in its text are shown, not obeyed; the
API key it echoes back is masked; its strings are clipped; a chunk of the wrong shape or an
HTML page is one clear line with exit status 2.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from click.testing import CliRunner, Result

from specchat.cli import main
from specchat.remote.chunks import parse_sse_line
from specchat.remote.client import ServerClient
from specchat.remote.server_errors import ServerError
from tests.remote.server import FakeServer, Script, openai_stream

KEY = "sk-live-0123456789abcdef"
AUTH = "{AUTHORIZATION}"
"""Replaced, in whatever the server sends, by the Authorization header it received."""
RAW_KEY = "{KEY}"
"""Replaced by the key alone (the header without ``Bearer``)."""

OSC52 = "\x1b]52;c;cHduZWQ=\x07"
CLEAR = "\x1b[2J"
TITLE = "\x1b]0;pwned\x07"
LINK = "\x1b]8;;http://evil.example/\x1b\\click\x1b]8;;\x1b\\"
CSI_C1 = "\x9b31m"
HOSTILE_PIECES = ["Hello", OSC52, " there", CLEAR, TITLE, LINK, CSI_C1, " end"]
CONTROL_BYTES = re.compile(rb"[\x00-\x08\x0b-\x1f\x7f]|\xc2[\x80-\x9f]")
"""C0 controls but \\t and \\n, DEL, and C1 controls as UTF-8 encodes them."""


class HostileServer(FakeServer):
    """The fake server, echoing the Authorization header it gets into what it answers, and
    optionally answering the chat request with an HTML page (a proxy's error page)."""

    def __init__(self, script: Script, *, html: str | None = None, text_errors: bool = False) -> None:
        super().__init__(script)
        base: Any = self.httpd.RequestHandlerClass

        def echo(text: str, auth: str) -> str:
            return text.replace(AUTH, auth).replace(RAW_KEY, auth.removeprefix("Bearer "))

        class Handler(base):
            def do_POST(self) -> None:
                auth = self.headers.get("Authorization", "")
                script.stream = [echo(payload, auth) for payload in script.stream]
                script.error_body = echo(script.error_body, auth)
                if html is not None:
                    self.rfile.read(int(self.headers.get("Content-Length", "0")))
                    self._send(200, "text/html; charset=utf-8", html)
                    return
                super().do_POST()

            def _send(self, status: int, ctype: str, body: str) -> None:
                if text_errors and status >= 400:
                    ctype = "text/plain"
                super()._send(status, ctype, echo(body, self.headers.get("Authorization", "")))

        self.httpd.RequestHandlerClass = Handler


def plain_server(pieces: list[str], model: str = "gpt-test") -> Script:
    models = json.dumps({"object": "list", "data": [{"id": model, "object": "model", "owned_by": "x"}]})
    return Script(documents={"/v1/models": (200, "application/json", models)}, stream=openai_stream(pieces))


def generate(url: str, *extra: str) -> Result:
    return CliRunner().invoke(main, ["generate", "hi", "--server", url, *extra])


def one_error_line(result: Result) -> str:
    lines = [
        line for line in result.stderr.splitlines() if line.startswith("specchat: ") and "note:" not in line
    ]
    errors = [line for line in lines if not line.startswith(("specchat: connecting", "specchat: attached"))]
    assert len(errors) == 1, result.stderr
    assert "Traceback" not in result.stderr
    return errors[0]


# ------------------------------------------------------------------ item 1: escape sequences


def test_text_format_writes_no_control_byte_but_shows_each_one() -> None:
    with FakeServer(plain_server(HOSTILE_PIECES)) as server:
        result = generate(server.url, "--format", "text")
    assert result.exit_code == 0, result.output
    out = result.stdout_bytes
    assert CONTROL_BYTES.search(out) is None, out
    assert "^[]52;c;cHduZWQ=^G" in result.stdout and "^[[2J" in result.stdout
    assert "^[]0;pwned^G" in result.stdout and "\\x9b31m" in result.stdout
    assert result.stdout.startswith("Hello") and result.stdout.rstrip().endswith("end")


def test_ansi_format_writes_only_its_own_styling(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FORCE_COLOR", "1")  # rich styles as on a terminal
    monkeypatch.delenv("NO_COLOR", raising=False)
    with FakeServer(plain_server(HOSTILE_PIECES)) as server:
        result = generate(server.url, "--format", "ansi")
    assert result.exit_code == 0, result.output
    out = result.stdout_bytes
    assert b"\x1b[" in out, "rich wrote no styling: the test would prove nothing"
    own_styling = re.compile(rb"\x1b\[[0-9;]*m")  # SGR: colours and bold, nothing else
    assert CONTROL_BYTES.search(own_styling.sub(b"", out)) is None, out
    assert "^[]0;pwned^G" in own_styling.sub(b"", out).decode()


def test_jsonl_format_keeps_the_raw_text_escaped_by_json() -> None:
    with FakeServer(plain_server(HOSTILE_PIECES)) as server:
        result = generate(server.url, "--format", "jsonl")
    assert result.exit_code == 0, result.output
    assert CONTROL_BYTES.search(result.stdout_bytes) is None
    texts = [json.loads(line)["text"] for line in result.stdout.splitlines() if '"token"' in line]
    assert "".join(texts) == "".join(HOSTILE_PIECES)  # nothing lost, nothing changed


def test_printers_neutralise_a_local_models_text_too() -> None:
    """The local engine's path goes through the same printers: a token holding ESC is shown."""
    from specchat.cli.generate_command import print_text
    from specchat.engine.events import UNKNOWN, TokenEvent

    tokens = [TokenEvent("target", 1, piece, 0, 0, UNKNOWN, None) for piece in HOSTILE_PIECES]
    runner = CliRunner()
    with runner.isolation() as (out, _err, _):
        print_text(iter(tokens))
        written = out.getvalue()
    assert CONTROL_BYTES.search(written) is None and b"^[[2J" in written


def test_server_error_text_and_model_id_are_shown_not_obeyed() -> None:
    script = plain_server(["a"], model="evil\x1b]0;pwned\x07model")
    script.status = 500
    script.error_body = json.dumps({"error": {"message": "boom\x1b[2J\x1b]52;c;eA==\x07"}})
    with FakeServer(script) as server:
        result = generate(server.url)
    assert result.exit_code == 2
    assert CONTROL_BYTES.search(result.stderr_bytes) is None, result.stderr
    assert "evil^[]0;pwned^Gmodel" in result.stderr
    assert "boom^[[2J^[]52;c;eA==^G" in one_error_line(result)


# ------------------------------------------------------------------ item 2: the echoed key


@pytest.fixture
def api_key(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("SPECCHAT_API_KEY", KEY)
    return KEY


def assert_no_key(result: Result) -> None:
    assert KEY not in result.output and KEY[:12] not in result.output, result.output


def test_a_401_that_echoes_the_bearer_token(api_key: str) -> None:
    script = plain_server(["a"])
    script.status = 401
    script.error_body = json.dumps({"error": {"message": f"key {AUTH} is invalid (also {RAW_KEY})"}})
    with HostileServer(script) as server:
        result = generate(server.url)
    assert result.exit_code == 2
    line = one_error_line(result)
    assert "refused the request (401: key Bearer *** is invalid (also ***))" in line
    assert_no_key(result)


def test_a_400_in_plain_text_that_echoes_the_key(api_key: str) -> None:
    script = plain_server(["a"])
    script.status = 400
    script.error_body = f"bad request from {RAW_KEY}\nsecond line"
    with HostileServer(script, text_errors=True) as server:
        result = generate(server.url)
    assert result.exit_code == 2
    assert "rejected the request (400: bad request from ***)" in one_error_line(result)
    assert_no_key(result)


def test_a_models_401_that_echoes_the_key(api_key: str) -> None:
    script = plain_server(["a"])
    script.documents["/v1/models"] = (401, "application/json", json.dumps({"error": f"who is {RAW_KEY}?"}))
    with HostileServer(script) as server:
        result = generate(server.url)
    assert result.exit_code == 2
    assert "(401: who is ***?)" in one_error_line(result)
    assert_no_key(result)


def test_an_sse_error_mid_reply_that_echoes_the_key(api_key: str) -> None:
    script = plain_server(["one", " two"])
    script.stream.insert(3, json.dumps({"error": {"message": f"quota exceeded for {AUTH}"}}))
    with HostileServer(script) as server:
        result = generate(server.url)
    assert result.exit_code == 2
    assert result.stdout.startswith("one two")  # what arrived is kept
    assert "error mid-reply: quota exceeded for Bearer ***" in one_error_line(result)
    assert_no_key(result)


def test_a_key_given_to_the_client_is_masked_without_the_environment() -> None:
    """A key from anywhere but SPECCHAT_API_KEY (the config, a test) is remembered as it is used."""
    key = "cfg-key-9f8e7d6c5b4a"
    script = plain_server(["a"])
    script.documents["/v1/models"] = (403, "application/json", json.dumps({"error": f"{RAW_KEY} is banned"}))
    with HostileServer(script) as server:
        client = ServerClient(server.url, api_key=key)
        with pytest.raises(ServerError) as caught:
            client.get_json("/v1/models")
        client.close()
    assert key not in str(caught.value) and "(403: *** is banned)" in str(caught.value)


def test_the_log_file_masks_the_key(api_key: str, tmp_path: Any) -> None:
    from specchat import logs

    try:
        raise RuntimeError(f"the server said: Bearer {KEY} \x1b]0;x\x07")
    except RuntimeError as err:
        line = logs.log_unexpected("unexpected error", err)
    written = logs.log_path().read_text(encoding="utf-8")
    assert KEY not in written and KEY not in line
    assert "\x1b" not in written and "\x1b" not in line
    assert "Bearer ***" in written


# ------------------------------------------------------------------ item 4: strings without limits


def test_a_5_mb_model_id_is_clipped() -> None:
    huge = "m" * 5_000_000
    with FakeServer(plain_server(["ok"], model=huge)) as server:
        result = generate(server.url)
    assert result.exit_code == 0, result.stderr[:500]
    attached = next(line for line in result.stderr.splitlines() if "attached to" in line)
    assert len(attached) < 400 and "more characters" in attached
    assert len(result.stderr) < 5_000


def test_a_50_mb_models_document_is_refused_at_its_cap() -> None:
    with FakeServer(plain_server(["ok"], model="m" * 50_000_000)) as server:
        result = generate(server.url)
    assert result.exit_code == 2
    assert "sent /v1/models of more than 8 MiB" in one_error_line(result)


def test_a_huge_error_message_is_clipped() -> None:
    script = plain_server(["a"])
    script.status = 500
    script.error_body = json.dumps({"error": {"message": "x" * 1_000_000}})
    with FakeServer(script) as server:
        result = generate(server.url)
    assert result.exit_code == 2
    assert len(one_error_line(result)) < 600


# ------------------------------------------------------------------ item 11: chunks of the wrong shape


@pytest.mark.parametrize(
    ("delta", "words"),
    [
        ({"content": 42}, "`content` is a number, not text"),
        ({"content": ["a", "b"]}, "`content` is a list, not text"),
        ({"content": {"text": "a"}}, "`content` is an object, not text"),
        ({"role": 7}, "`role` is a number, not text"),
    ],
)
def test_a_chunk_whose_content_is_not_text_is_one_line_and_status_2(
    delta: dict[str, Any], words: str
) -> None:
    script = plain_server(["fine"])
    script.stream.insert(2, json.dumps({"choices": [{"index": 0, "delta": delta, "finish_reason": None}]}))
    with FakeServer(script) as server:
        result = generate(server.url)
    assert result.exit_code == 2, result.output
    line = one_error_line(result)
    assert "malformed chunk" in line and words in line
    assert result.stdout.startswith("fine")


@pytest.mark.parametrize(
    ("chunk", "words"),
    [
        ({"choices": {"0": {}}}, "`choices` is an object, not a list"),
        ({"choices": ["text"]}, "a choice is text, not an object"),
        ({"choices": [{"delta": "hi"}]}, "`delta` is text, not an object"),
        ({"choices": [{"delta": {}, "finish_reason": ["stop"]}]}, "`finish_reason` is a list, not text"),
        ({"choices": [{"delta": {}, "logprobs": [1]}]}, "`logprobs` is a list, not an object"),
        ({"choices": [], "usage": {"completion_tokens": "3"}}, "`usage.completion_tokens` is text"),
        ({"choices": [], "timings": {"predicted_ms": [1]}}, "`timings.predicted_ms` is a list"),
        ({"choices": [], "timings": {"prompt_n": True}}, "`timings.prompt_n` is true/false"),
    ],
)
def test_every_chunk_shape_a_reader_relies_on_is_checked_where_chunks_are_parsed(
    chunk: dict[str, Any], words: str
) -> None:
    with pytest.raises(ServerError) as caught:
        parse_sse_line("data: " + json.dumps(chunk), "http://x")
    assert words in str(caught.value)


def test_well_formed_chunks_pass_unchanged() -> None:
    for payload in openai_stream(["a", "b"])[:-1]:
        assert parse_sse_line("data: " + payload, "http://x") == json.loads(payload)
    assert (
        parse_sse_line('data: {"choices": [{"delta": {"content": null}}], "usage": null}', "http://x")
        is not None
    )


# ------------------------------------------------------------------ item 12: an HTML page


PAGE = (
    "<!DOCTYPE html><html><head><title>502 Bad Gateway</title><style>body{color:red}</style>"
    "</head><body><h1>Bad \x1b[2Jgateway</h1><p>nginx &amp; friends</p>" + "<p>filler</p>" * 2000
)


def test_a_200_html_page_says_it_is_html_and_what_it_says() -> None:
    with HostileServer(plain_server(["a"]), html=PAGE) as server:
        result = generate(server.url)
    assert result.exit_code == 2, result.output
    line = one_error_line(result)
    assert "HTML page" in line and "not a stream of events" in line
    assert "it says: 502 Bad Gateway Bad ^[[2Jgateway nginx & friends" in line
    assert "ended the stream" not in line and "color:red" not in line
    assert len(line) < 500


def test_an_html_error_page_is_named_as_one() -> None:
    script = plain_server(["a"])
    script.status = 503
    script.error_body = "<html><title>Service Unavailable</title><body>try later</body></html>"
    with HostileServer(script) as server:
        handler: Any = server.httpd.RequestHandlerClass  # the fake's own class, which has _send
        handler._send = _as_html(handler._send)
        result = generate(server.url)
    assert result.exit_code == 2
    assert "(503: an HTML page saying Service Unavailable try later)" in one_error_line(result)


def _as_html(send: Any) -> Any:
    def html_send(self: Any, status: int, ctype: str, body: str) -> None:
        send(self, status, "text/html" if status >= 400 else ctype, body)

    return html_send
