"""The log file: where the traceback of an unexpected error goes, so the screen shows one line.

``<user data folder>/logs/specchat.log``, rotated (Python's RotatingFileHandler) so it never
grows without bound. Expected errors (a bad flag, a missing model) are SpecchatErrors whose
message says what to do; anything else is a bug or an environment problem, and its one line
for the user names this file. ``--debug`` (or ``SPECCHAT_DEBUG=1``) prints the traceback too.

Pure standard library plus specchat.config: the CLI, the TUI and the worker bridge all use it.
"""

from __future__ import annotations

import logging
import os
import threading
import traceback
from logging.handlers import RotatingFileHandler
from pathlib import Path

from specchat.config import data_dir
from specchat.errors import gist
from specchat.untrusted import masked, visible

LOG_FILE = "specchat.log"
MAX_BYTES = 512 * 1024
BACKUPS = 3
"""Rotated files kept beside the current one (specchat.log.1 … .3)."""

_lock = threading.Lock()
_logger = logging.getLogger("specchat")
_handler: RotatingFileHandler | None = None
_handler_for: Path | None = None
_debug = False
_tracebacks: list[str] = []


def log_path() -> Path:
    return data_dir() / "logs" / LOG_FILE


def set_debug(enabled: bool) -> None:
    """--debug: print tracebacks as well as logging them."""
    global _debug
    _debug = enabled


def debug_enabled() -> bool:
    return _debug or os.environ.get("SPECCHAT_DEBUG", "").strip().lower() in ("1", "true", "yes")


def _file_handler() -> RotatingFileHandler | None:
    """The handler for the current data folder (tests move it), made on first use; None when
    the folder cannot be written (the error is still shown, only its details are not kept)."""
    global _handler, _handler_for
    path = log_path()
    with _lock:
        if _handler is not None and _handler_for == path:
            return _handler
        if _handler is not None:
            _logger.removeHandler(_handler)
            _handler.close()
            _handler = _handler_for = None
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            handler = RotatingFileHandler(path, maxBytes=MAX_BYTES, backupCount=BACKUPS, encoding="utf-8")
        except OSError:
            return None
        handler.setFormatter(_MaskingFormatter("%(asctime)s %(levelname)s %(threadName)s: %(message)s"))
        _logger.addHandler(handler)
        _logger.setLevel(logging.INFO)
        _logger.propagate = False
        _handler, _handler_for = handler, path
        return handler


class _MaskingFormatter(logging.Formatter):
    """Every record, traceback included, with the API key masked and control characters shown:
    an error's text may quote a server that echoed the key, and the log is read in a terminal."""

    def format(self, record: logging.LogRecord) -> str:
        return visible(masked(super().format(record)))


def log_unexpected(what: str, err: BaseException) -> str:
    """Log ``err`` with its traceback; return the one line to show the user.

    The line says what failed, the error's gist, and where the details are.
    """
    summary = _named_gist(err)
    handler = _file_handler()
    if handler is not None:
        try:
            _logger.error("%s: %s", what, summary, exc_info=err)
            handler.flush()
        except Exception:  # logging must never turn one error into two
            handler = None
    if debug_enabled():
        with _lock:
            _tracebacks.append(format_traceback(err))
    where = f"details in {log_path()}" if handler is not None else "no log could be written"
    return f"{what}: {summary} ({where}; --debug prints them)."


def debug_tracebacks() -> list[str]:
    """With --debug, the tracebacks logged so far (the TUI prints them once the screen is back)."""
    with _lock:
        taken = list(_tracebacks)
        _tracebacks.clear()
    return taken


def format_traceback(err: BaseException) -> str:
    return visible(masked("".join(traceback.format_exception(err)).rstrip()))


def _named_gist(err: BaseException) -> str:
    text = gist(visible(masked(str(err))))
    return f"{type(err).__name__}: {text}" if text else type(err).__name__
