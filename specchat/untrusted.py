"""Text specchat did not write itself, made safe to show: a model's reply, a server's answer, a file.

Such text can hold terminal control sequences (clear the screen, set the title, write the
clipboard through OSC 52, hyperlinks through OSC 8), characters that rearrange or hide what the
reader sees (bidi overrides and isolates, the Trojan Source class, CVE-2021-42574; zero-width
characters; Unicode tag characters that smuggle invisible ASCII), the user's API key echoed back
by a server, or a 50 MB string. Everything that reaches a terminal or a file passes through one
of these:

- :func:`visible` shows every such character as printable text instead of obeying it: C0/C1
  controls except newline and tab as ``^[``, ``^G``, ``^?`` or ``\\x9b``, the invisible and bidi
  format characters as ``⟨U+202E⟩``. Zero-width joiners that hold an emoji sequence or a word of
  a script that needs them (Arabic, Persian, the Indic scripts) stay, since there they are seen;
- :func:`json_text` writes JSON with those characters escaped (``\\u202e``): lossless, and a
  saved file is safe to ``cat``;
- :func:`masked` replaces the API key (whatever its length) and any ``Bearer`` token with ``***``;
- :func:`server_text` does both and cuts the result to :data:`SERVER_TEXT_LIMIT` characters, for
  one-line messages built from what a server said (errors, model ids).

Torch-free and Textual-free, so the CLI, the UI and the remote client can all use it.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

API_KEY_ENV = "SPECCHAT_API_KEY"
SERVER_TEXT_LIMIT = 300
MASK = "***"

# Every C0 control but \t and \n, DEL, and the C1 range. \r is included: a bare carriage return
# lets later text overwrite what the line already shows.
_C0_C1 = "\x00-\x08\x0b-\x1f\x7f-\x9f"
# Format characters that are invisible or reorder the text around them.
_BIDI = "\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"
_INVISIBLE = (
    "\u00ad"  # soft hyphen
    "\u180e"  # Mongolian vowel separator
    "\u200b"  # zero-width space
    "\u2028\u2029"  # line and paragraph separators: a break to Python, none to a terminal
    "\u2060-\u2064\u206a-\u206f"  # word joiner, invisible operators, deprecated format controls
    "\ufeff"  # byte order mark / zero-width no-break space
    "\ufff9-\ufffb"  # interlinear annotation
    "\U000e0000-\U000e007f"  # tag characters: invisible ASCII
)
_JOINERS = "\u200c\u200d"
_JOINED = (
    "\u0600-\u06ff\u0750-\u077f\u08a0-\u08ff\ufb50-\ufdff\ufe70-\ufefe"  # Arabic script
    "\u0900-\u0dff"  # the Indic scripts
    "\u2600-\u27bf\u2b00-\u2bff\ufe0f\U0001f000-\U0001faff"  # emoji (and their presentation form)
)
"""Characters between which a zero-width (non-)joiner changes what is seen, so it stays."""
_UNSAFE = re.compile(
    f"[{_C0_C1}{_BIDI}{_INVISIBLE}]|[{_JOINERS}](?:(?<![{_JOINED}][{_JOINERS}])|(?![{_JOINED}]))"
)
_CANDIDATE = re.compile(f"[{_C0_C1}{_BIDI}{_INVISIBLE}{_JOINERS}]")
"""One character class, which the regex engine scans for fast: a text without any (most) is
returned as it is after one quick pass (a saved conversation is megabytes, saved per reply)."""
_BEARER = re.compile(r"(?i)(bearer\s+)[^\s\"',;]+")
_secrets: set[str] = set()


def _shown(char: str) -> str:
    code = ord(char)
    if code < 0x20:
        return "^" + chr(code + 0x40)
    if code == 0x7F:
        return "^?"
    if code <= 0x9F:
        return f"\\x{code:02x}"
    return f"⟨U+{code:04X}⟩"


def visible(text: str) -> str:
    """``text`` with its control, bidi and invisible characters shown instead of obeyed
    (newline and tab kept)."""
    if _CANDIDATE.search(text) is None:
        return text
    return _UNSAFE.sub(lambda match: _shown(match.group()), text)


def has_controls(text: str) -> bool:
    """Whether :func:`visible` would change ``text``."""
    return _CANDIDATE.search(text) is not None and _UNSAFE.search(text) is not None


def _json_escape(char: str) -> str:
    code = ord(char)
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    code -= 0x10000
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"


def json_text(data: object, **options: Any) -> str:
    """``json.dumps(data, ensure_ascii=False, **options)`` with every character :func:`visible`
    would show escaped as JSON escapes it (``\\u202e``): the text reads back exactly as it was,
    and a terminal that shows the file obeys none of it. (JSON escapes C0 itself; DEL, C1, bidi
    and invisible characters it would leave raw.)"""
    text = json.dumps(data, ensure_ascii=False, **options)
    if _CANDIDATE.search(text) is None:
        return text
    return _UNSAFE.sub(lambda match: _json_escape(match.group()), text)


def remember_secret(value: str | None) -> None:
    """Mask ``value`` from now on (an API key that came from the config file or a flag). A key
    of any length is masked, a short one too: "***" in an error line costs less than a key on a
    projected screen."""
    if value:
        _secrets.add(value)


def _known_secrets() -> list[str]:
    secrets = set(_secrets)
    env = os.environ.get(API_KEY_ENV, "").strip()
    if env:
        secrets.add(env)
    return sorted(secrets, key=len, reverse=True)  # a key that contains another is masked whole


def masked(text: str) -> str:
    """``text`` with the API key and any bearer token replaced by ``***``."""
    for secret in _known_secrets():
        text = text.replace(secret, MASK)
    return _BEARER.sub(lambda match: match.group(1) + MASK, text)


def clipped(text: str, limit: int = SERVER_TEXT_LIMIT) -> str:
    """``text`` cut to ``limit`` characters, saying how much was left out."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(text) - limit:,} more characters)"


def server_text(text: object, limit: int = SERVER_TEXT_LIMIT) -> str:
    """A string that came from a server, ready for a one-line message: masked, clipped, visible.

    Masked before it is clipped, so a key cut in half is never shown; clipped before it is made
    visible, so a string of control characters cannot grow past the limit by much.
    """
    return visible(clipped(masked(str(text)), limit))
