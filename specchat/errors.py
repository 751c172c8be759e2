"""Errors a user can act on. The CLI and the TUI print `str(err)` as one line, never a traceback."""

from __future__ import annotations


class SpecchatError(Exception):
    """Base class: the message alone must tell the user what went wrong and what to do."""

    exit_code = 2


class ModelNotFoundError(SpecchatError):
    """An unknown short name, a missing folder or file, or a hub id that is not cached."""


class ModelLoadError(SpecchatError):
    """A file that exists but cannot be loaded: corrupt or truncated GGUF, bad checksum."""


class TokenizerMismatchError(SpecchatError):
    """Target and draft do not share a vocabulary and special tokens."""


class InvalidSettingError(SpecchatError):
    """A sampling or speculation setting outside its valid range."""


class ContextTooLongError(SpecchatError):
    """The prompt leaves no room to generate within the model's context length."""


class OutOfMemoryError(SpecchatError):
    """The device ran out of memory while loading or decoding."""


def gist(text: str, limit: int = 200) -> str:
    """The gist of an error's text: its first non-empty line, whitespace collapsed, cut to ``limit``
    characters ("" when there is none). Library errors often run to pages; a user gets one line."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    first = " ".join(lines[0].split()) if lines else ""
    return first if len(first) <= limit else first[: limit - 1] + "…"
