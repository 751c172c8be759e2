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


REORDERING = [
    "\u202eevil",  # right-to-left override: the Trojan Source class
    "a\u202ab\u202c",
    "\u2066isolate\u2069",
    "\u200bzero\u200cwidth\u200d",
    "\u200e\u200f\u061c",
    "\ufeffbom",
    "line\u2028break",
    "tag\U000e0041\U000e0042",  # invisible ASCII
]


@pytest.mark.parametrize("text", REORDERING)
def test_bidi_and_invisible_characters_are_shown_by_their_code_point(text: str) -> None:
    shown = visible(text)
    assert has_controls(text) and not has_controls(shown)
    assert "⟨U+" in shown
    assert not any(
        0x200B <= ord(c) <= 0x200F or 0x202A <= ord(c) <= 0x202E or 0x2066 <= ord(c) <= 0x2069 for c in shown
    )


def test_visible_names_each_character_it_shows() -> None:
    assert visible("x\u202ey") == "x⟨U+202E⟩y"
    assert visible("a\U000e0041") == "a⟨U+E0041⟩"


def test_joiners_that_hold_an_emoji_or_a_word_together_stay() -> None:
    family = "👨\u200d👩\u200d👧"
    persian = "می\u200cخواهم"
    hindi = "क्\u200dष"
    for text in (family, persian, hindi):
        assert visible(text) == text and not has_controls(text)
    assert visible("a\u200db") == "a⟨U+200D⟩b"  # between Latin letters it only hides


def test_json_text_escapes_what_visible_shows_and_reads_back_exactly() -> None:
    import json

    from specchat.untrusted import json_text

    data = {"text": "safe \u202eevil\x9b\x7f\U000e0041 👨\u200d👩 ok"}
    written = json_text(data)
    assert not has_controls(written)
    assert "\\u202e" in written and "\\udb40\\udc41" in written and "👨\u200d👩" in written
    assert json.loads(written) == data


def test_a_short_key_is_masked_in_full(monkeypatch: pytest.MonkeyPatch) -> None:
    from specchat import untrusted

    monkeypatch.setattr(untrusted, "_secrets", set())  # remembered keys stay for the process
    monkeypatch.setenv("SPECCHAT_API_KEY", "k9")
    assert masked("bad key k9 for you") == "bad key *** for you"
    remember_secret("Z")
    assert "Z" not in masked("Zebra")
