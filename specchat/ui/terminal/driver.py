"""The terminal driver for the real chat: it survives the terminal going away.

When the terminal disappears mid-reply (an ssh connection drops, a tmux server is killed, a
window is closed), every write to it fails with EIO. Textual's writer thread dies on the first
such error, its bounded queue fills, and the next write on the event loop blocks forever, so the
app never reaches the code that saves the reply and exits: the process hung, ignoring SIGHUP,
SIGTERM and SIGINT, until SIGKILL.

Here a write that fails marks the terminal as gone, later output is dropped instead of queued
forever, and the app is told once (``on_gone``) so it can quit as Ctrl+Q does, keeping the
reply. :class:`QuitDeadline` is the last resort: once a quit has been asked for by a signal,
the process ends within a few seconds even if something else still blocks.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import IO, Any

from textual.drivers._writer_thread import WriterThread

HANGUP_DEADLINE = 4.0
"""Seconds from a quitting signal to the end of the process, whatever still runs then."""


class TolerantWriter(WriterThread):
    """Textual's writer thread, which stops writing (instead of dying) once the terminal is gone."""

    def __init__(self, file: IO[str], on_gone: Callable[[], None]) -> None:
        super().__init__(file)
        self.gone = threading.Event()
        self._on_gone = on_gone

    def run(self) -> None:
        while True:
            text = self._queue.get()
            if text is None:
                break
            if not self.gone.is_set():
                self._write(text, flush=self._queue.qsize() == 0)
        if not self.gone.is_set():
            self._write("", flush=True)

    def _write(self, text: str, *, flush: bool) -> None:
        try:
            self._file.write(text)
            if flush:
                self._file.flush()
        except (OSError, ValueError):  # EIO once the terminal hung up; ValueError once it is closed
            self.gone.set()
            self._on_gone()


def tolerant_driver(base: type[Any], on_gone: Callable[[], None]) -> type[Any]:
    """``base`` (Textual's driver for this platform) with its writer replaced by a tolerant one.

    Only drivers that own a writer thread (the POSIX driver) are changed; others are returned
    as they are.
    """

    class TolerantDriver(base):  # type: ignore[misc, valid-type]
        def start_application_mode(self) -> None:
            super().start_application_mode()
            writer = getattr(self, "_writer_thread", None)
            if not isinstance(writer, WriterThread) or isinstance(writer, TolerantWriter):
                return
            writer.stop()  # writes what the driver queued so far, in order, then ends
            replacement = TolerantWriter(writer._file, on_gone)
            replacement.start()
            self._writer_thread = replacement

    TolerantDriver.__name__ = f"Tolerant{base.__name__}"
    return TolerantDriver


class QuitDeadline:
    """Ends the process ``seconds`` after :meth:`start`, unless it has exited by then.

    A quit keeps the reply and restores the terminal within a second or two; this covers the
    case where something (a write to a dead terminal, a stuck worker) keeps it from finishing.
    """

    def __init__(self, seconds: float = HANGUP_DEADLINE) -> None:
        self.seconds = seconds
        self._timer: threading.Timer | None = None

    @property
    def started(self) -> bool:
        return self._timer is not None

    def start(self, status: int) -> None:
        """Start counting (once: a hangup often arrives as SIGHUP and as a failed write)."""
        if self._timer is not None:
            return
        self._timer = threading.Timer(self.seconds, self.end_now, args=(status,))
        self._timer.daemon = True
        self._timer.start()

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()

    @staticmethod
    def end_now(status: int) -> None:
        # No flushing, no atexit handlers: either could block on the terminal that went away.
        os._exit(status)
