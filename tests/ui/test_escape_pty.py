"""No escape sequence from a server or a shared file reaches the real terminal.

The real `specchat chat --server` and `specchat replay` run in a pseudo-terminal; every byte
they write is kept. specchat's own escape sequences are there, of course, so the test looks for
recognisable foreign ones: an OSC 52 clipboard write, an OSC 0 window title, an OSC 8 link and
a C1 CSI. Each must be absent raw and present visibly (``^[]0;pwned``).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from specchat.engine.events import TokenEvent
from tests.remote.server import FakeServer, Script, openai_stream
from tests.ui.test_terminal import Terminal

pytestmark = [
    pytest.mark.skipif(sys.platform == "win32", reason="needs a POSIX pseudo-terminal"),
    pytest.mark.spawns,
]

PIECES = [
    "Hello",
    "\x1b]52;c;cHduZWQ=\x07",
    " then ",
    "\x1b]0;pwned\x07",
    "\x1b]8;;http://evil.example/\x1b\\link\x1b]8;;\x1b\\",
    "\x9b31m",
    " the end",
]
FOREIGN = (b"\x1b]52;c;cHduZWQ=", b"\x1b]0;pwned", b"\x1b]8;;http://evil", b"\xc2\x9b31m")


def environment(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPECCHAT_")}
    env.update(
        TERM="xterm-256color",
        SPECCHAT_DATA_DIR=str(tmp_path / "data"),
        SPECCHAT_CONFIG=str(tmp_path / "config.toml"),
        SPECCHAT_CACHE_DIR=str(tmp_path / "cache"),
        HF_HUB_OFFLINE="1",
    )
    return env


@pytest.fixture
def terminals() -> Iterator[list[Terminal]]:
    started: list[Terminal] = []
    yield started
    for terminal in started:
        terminal.close()


def assert_nothing_foreign(terminal: Terminal) -> None:
    raw = bytes(terminal.output)
    for sequence in FOREIGN:
        assert sequence not in raw, f"{sequence!r} reached the terminal raw"
    assert "^[]0;pwned^G" in terminal.text  # shown, so the user sees what the server tried


def test_chat_with_a_server_streaming_escapes_writes_none_to_the_terminal(
    tmp_path: Path, terminals: list[Terminal]
) -> None:
    models = json.dumps({"object": "list", "data": [{"id": "gpt-test", "object": "model", "owned_by": "x"}]})
    script = Script(documents={"/v1/models": (200, "application/json", models)}, stream=openai_stream(PIECES))
    with FakeServer(script) as server:
        args = [sys.executable, "-m", "specchat", "chat", "--server", server.url]
        terminal = Terminal(args, environment(tmp_path))
        terminals.append(terminal)
        terminal.wait_for(lambda: "server openai" in terminal.text, what="the chat to attach")
        terminal.write("hi\r")
        terminal.wait_for(lambda: "the end" in terminal.text, what="the reply")
        terminal.write("\x11")  # Ctrl+Q
        assert terminal.wait_exit() == 0
    assert_nothing_foreign(terminal)


def test_replay_of_a_shared_file_with_escapes_writes_none_to_the_terminal(
    tmp_path: Path, terminals: list[Terminal]
) -> None:
    tokens = [
        TokenEvent("target", -1, piece, i, 0, float("nan"), None).to_json() for i, piece in enumerate(PIECES)
    ]
    shared = tmp_path / "shared.json"
    shared.write_text(
        json.dumps(
            {
                "format": "specchat-conversation",
                "version": 1,
                "id": "x",
                "models": {"target": "t", "draft": None},
                "system_prompt": "",
                "messages": [
                    {"role": "user", "content": "hi \x1b]0;pwned\x07"},
                    {"role": "assistant", "content": "".join(PIECES), "tokens": tokens},
                ],
            }
        )
    )
    args = [sys.executable, "-m", "specchat", "replay", str(shared), "--speed", "4"]
    terminal = Terminal(args, environment(tmp_path))
    terminals.append(terminal)
    terminal.wait_for(lambda: "finished" in terminal.text and "the end" in terminal.text, what="the replay")
    terminal.write("q")
    assert terminal.wait_exit() == 0
    assert_nothing_foreign(terminal)
