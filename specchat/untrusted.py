"""Text specchat did not write itself, made safe to show: a model's reply, a server's answer, a file.

Such text can hold terminal control sequences (clear the screen, set the title, write the
clipboard through OSC 52, hyperlinks through OSC 8), the user's API key echoed back by a server,
or a 50 MB string. Everything that reaches a terminal or an export passes through one of these:

- :func:`visible` shows every C0/C1 control character except newline and tab as printable text
  (ESC as ``^[``, BEL as ``^G``, DEL as ``^?``, a C1 byte such as CSI as ``\\x9b``), so it is seen
  and never obeyed;
- :func:`masked` replaces the API key and any ``Bearer`` token with ``***``;
- :func:`server_text` does both and cuts the result to :data:`SERVER_TEXT_LIMIT` characters, for
  one-line messages built from what a server said (errors, model ids).

The JSON lines output keeps the raw text: JSON escapes control characters itself.
Torch-free and Textual-free, so the CLI, the UI and the remote client can all use it.
"""

from __future__ import annotations

import os
import re

API_KEY_ENV = "SPECCHAT_API_KEY"
SERVER_TEXT_LIMIT = 300
MASK = "***"

# Every C0 control but \t and \n, DEL, and the C1 range. \r is included: a bare carriage return
# lets later text overwrite what the line already shows.
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_BEARER = re.compile(r"(?i)(bearer\s+)[^\s\"',;]+")
_secrets: set[str] = set()


def _shown(char: str) -> str:
    code = ord(char)
    if code < 0x20:
        return "^" + chr(code + 0x40)
    if code == 0x7F:
        return "^?"
    return f"\\x{code:02x}"


def visible(text: str) -> str:
    """``text`` with its control characters shown instead of obeyed (newline and tab kept)."""
    return _CONTROL.sub(lambda match: _shown(match.group()), text)


def has_controls(text: str) -> bool:
    return _CONTROL.search(text) is not None


def remember_secret(value: str | None) -> None:
    """Mask ``value`` from now on (an API key that came from the config file or a flag)."""
    if value and len(value) >= 4:
        _secrets.add(value)


def _known_secrets() -> list[str]:
    secrets = set(_secrets)
    env = os.environ.get(API_KEY_ENV, "")
    if len(env) >= 4:
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
