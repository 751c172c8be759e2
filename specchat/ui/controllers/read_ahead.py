"""Reading ahead: while nobody waits (the user types, or reads the last reply), the models read
what is already known of the next prompt, so the next reply's first token comes sooner
(:meth:`specchat.engine.backend.Backend.read_ahead`; the local engine reads with row-exact models only,
and a server has nothing to read).

When: :data:`DELAY` after the message box last changed, after the models load, after a reply
closes and after a talk job ends. The delay makes a burst of keys (or a paste) one read-ahead,
and lets a reply's close finish first, so the conversation read holds the new reply.
Never while a reply streams or a talk job holds the models, and one at a time: a new read-ahead
cancels the one before. Starting a reply and quitting cancel it first, so neither waits on
reading for more than the engine's one chunk.

The prompt read is the one Enter would send: the conversation's messages, built as the reply
builds them (:meth:`~specchat.store.conversation.Conversation.chat_messages`), with what the box
holds as the newest user message, under the same controls.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from textual.worker import Worker, get_current_worker

from specchat.ui.controllers.hosts import RunsWorkers
from specchat.ui.workers import bridge

if TYPE_CHECKING:
    from textual.timer import Timer

    from specchat.engine.backend import Controls
    from specchat.store.conversation import Conversation
    from specchat.ui.state.lease import ModelLease

DELAY = 0.5
"""Seconds of quiet (no key in the box, no reply closing) before reading ahead."""


class ReadAheadHost(RunsWorkers, Protocol):
    """What reading ahead needs from the app (the conversation is read at each use: clearing the
    chat or opening another conversation swaps it)."""

    conversation: Conversation

    def set_timer(
        self,
        delay: float,
        callback: Callable[[], Any] | None = None,
        *,
        name: str | None = None,
        pause: bool = False,
    ) -> Timer: ...


def next_prompt(conversation: Conversation, typed: str) -> list[dict[str, str]]:
    """The messages the next reply will get if Enter sends ``typed`` (as it is, stripped, the
    way the message box sends it); the conversation alone when nothing is typed."""
    messages = conversation.chat_messages()
    text = typed.strip()
    if text:
        messages.append({"role": "user", "content": text})
    return messages


class ReadingAhead:
    """The one read-ahead that may run, and the one waiting for its delay."""

    def __init__(
        self,
        host: ReadAheadHost,
        lease: ModelLease,
        typed: Callable[[], str | None],
        delay: float = DELAY,
    ) -> None:
        self.host = host
        self.lease = lease
        self.typed = typed
        """What the message box holds now; None once it is gone (the app is closing)."""
        self.delay = delay
        self.worker: Worker[None] | None = None
        """The read-ahead running (or just cancelled and finishing its chunk), if any."""
        self._timer: Timer | None = None
        self._closed = False

    def schedule(self) -> None:
        """Read ahead after :attr:`delay` of quiet (each call starts the delay again)."""
        if self._closed:
            return
        if self._timer is not None:
            self._timer.stop()
        self._timer = self.host.set_timer(self.delay, self.start, name="read ahead")

    def models_changed(self) -> None:
        """The models' holder changed: a reply or a talk job took them (stop reading), or they
        are free again (loaded, a reply closed, a job ended: read what is known, soon)."""
        if self.lease.busy_reason() is not None:
            self.cancel()
        else:
            self.schedule()

    def start(self) -> None:
        """Read ahead now, cancelling the read-ahead before; nothing while the models are busy."""
        self.cancel()
        if self._closed or self.lease.busy_reason() is not None:
            return
        typed = self.typed()
        if typed is None:  # the app is closing (a test's app, which quits without the quit key)
            return
        backend, controls = self.lease.backend, self.lease.controls
        assert backend is not None and controls is not None  # busy_reason says they are loaded
        messages = next_prompt(self.host.conversation, typed)
        self.worker = self.host.run_worker(
            lambda: self._read(backend, messages, controls),
            name="read ahead",
            group="read ahead",
            thread=True,
            exit_on_error=False,
        )

    @staticmethod
    def _read(backend: bridge.Backend, messages: list[dict[str, str]], controls: Controls) -> None:
        # The worker's cancelled event is the engine's stop flag: cancel() sets it, and
        # Textual sets it for every worker when the app exits.
        bridge.read_ahead(backend, messages, controls, get_current_worker().cancelled_event)

    def cancel(self) -> None:
        """Stop the read-ahead running (the engine stops within one chunk) and the one waiting."""
        if self._timer is not None:
            self._timer.stop()
            self._timer = None
        if self.worker is not None:
            self.worker.cancel()
            self.worker = None

    def close(self) -> None:
        """The app quits: stop reading, and start nothing more."""
        self._closed = True
        self.cancel()
