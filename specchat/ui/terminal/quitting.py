"""Quitting on signals and a hung-up terminal, and what a crash saves on its way out.

SIGTERM, SIGHUP and SIGINT quit as Ctrl+Q does: the streaming reply is kept and the terminal
restored. Python's default for SIGTERM ends the process at once, leaving the terminal in the
alternate screen with mouse tracking on and the streaming reply unsaved.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Callable

from textual.app import App

from specchat import logs
from specchat.store.conversation import Conversation
from specchat.store.folder import ConversationStore
from specchat.ui.controllers.reply import Replies
from specchat.ui.terminal.driver import QuitDeadline, tolerant_driver


class SignalQuit:
    """Turns SIGTERM, SIGHUP, SIGINT and a hung-up terminal into one ``request_quit``."""

    def __init__(self, request_quit: Callable[[int], None]) -> None:
        self.request_quit = request_quit
        self.deadline: QuitDeadline | None = None
        """Set where the app runs on the real terminal (:func:`run_in_terminal`): it ends the
        process within seconds of a signal even when something stays blocked on a dead terminal."""
        self._loop: asyncio.AbstractEventLoop | None = None

    def install(self) -> None:
        """Handle the signals on the running loop (the real terminal; tests leave them alone)."""
        loop = self._loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
            loop.add_signal_handler(signum, self.on_signal, 128 + signum)

    def on_signal(self, exit_status: int) -> None:
        # The quit itself is asked for once: a hangup comes as a signal and as a failed write,
        # and two quits would keep the reply twice.
        deadline = self.deadline
        if deadline is not None:
            if deadline.started:
                return
            deadline.start(exit_status)
        self.request_quit(exit_status)

    def terminal_gone(self) -> None:
        """The terminal hung up (called from the writer thread): quit as on SIGHUP, keeping the reply."""
        if self._loop is None:
            return
        with contextlib.suppress(RuntimeError):  # the loop has already closed: nothing left to keep
            self._loop.call_soon_threadsafe(self.on_signal, 128 + signal.SIGHUP)


def run_in_terminal(app: App[int], quitter: SignalQuit) -> None:
    """Run ``app`` on the real terminal, surviving the terminal's hangup (see ui/driver.py)."""
    deadline = quitter.deadline = QuitDeadline()
    app.driver_class = tolerant_driver(app.driver_class, quitter.terminal_gone)
    try:
        app.run()
    finally:
        deadline.cancel()


def save_after_crash(
    error: Exception, replies: Replies, conversation: Callable[[], Conversation], store: ConversationStore
) -> str:
    """A bug: log the traceback, keep the streaming reply and save the conversation.

    Returns the one line to leave on the terminal. The conversation is read after the reply is
    kept, since keeping it adds its turn.
    """
    line = logs.log_unexpected("specchat stopped on an unexpected error", error)
    with contextlib.suppress(Exception):
        replies.keep_after_crash()
        chat = conversation()
        if chat.turns:
            store.save(chat)
    return line
