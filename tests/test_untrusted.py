"""The one place untrusted text is made safe to show (specchat/untrusted.py)."""

from __future__ import annotations

import pytest

from specchat.untrusted import clipped, has_controls, masked, remember_secret, server_text, visible

HOSTILE = [
    "\x1b]52;c;aGVsbG8=\x07",  # OSC 52: write the clipboard
    "\x1b[2J",  # clear the screen
    "\x1b]0;pwned\x07",  # window title
    "\x1b]8;;http://x\x1b\\link\x1b]8;;\x1b\\",  # OSC 8 hyperlink
    "\x9b2J",  # C1 CSI
    "a\rb",  # carriage return overwrites the line
    "\x7f\x00\x08",
]


@pytest.mark.parametrize("text", HOSTILE)
def test_visible_leaves_no_control_character(text: str) -> None:
    shown = visible(text)
    assert has_controls(text)
    assert not has_controls(shown)
    assert not any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F for c in shown)


def test_visible_keeps_newline_tab_and_unicode() -> None:
    text = "def f():\n\treturn 'γ → α ✓'"
    assert visible(text) == text


def test_visible_shows_what_was_there() -> None:
    assert visible("\x1b[2J") == "^[[2J"
    assert visible("\x07") == "^G"
    assert visible("\x9b") == "\\x9b"
    assert visible("\x7f") == "^?"


def test_masked_hides_the_env_key_and_bearer_tokens(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECCHAT_API_KEY", "sk-live-12345")
    assert masked("key sk-live-12345 is invalid") == "key *** is invalid"
    assert masked('{"error": "Bearer abc.def-ghi rejected"}') == '{"error": "Bearer *** rejected"}'


def test_masked_hides_a_remembered_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SPECCHAT_API_KEY", raising=False)
    remember_secret("from-config-key-999")
    assert "from-config-key-999" not in masked("got from-config-key-999!")


def test_server_text_is_clipped_masked_and_visible(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECCHAT_API_KEY", "sk-live-12345")
    line = server_text("\x1b[31m sk-live-12345 " + "m" * 50_000_000)
    assert "sk-live-12345" not in line
    assert not has_controls(line)
    assert len(line) < 400
    assert "more characters" in line


def test_clipped_leaves_short_text_alone() -> None:
    assert clipped("short") == "short"
