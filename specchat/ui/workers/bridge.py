"""The worker bridge: how the UI's reply and load workers drive a backend (the local engine or a
server), without importing torch.

It runs inside Textual thread workers (loading: :mod:`specchat.ui.workers.model_loading`; a reply:
:mod:`specchat.ui.controllers.reply`) and hands results back only through ``post_message``. The talk jobs
(race, self-test, theory probe) reach the models through the lease
(:mod:`specchat.ui.state.lease`). Between replies a read-ahead worker
(:mod:`specchat.ui.controllers.read_ahead`) lets the backend read the next prompt's known part
(:func:`read_ahead`).
A backend that can step (the local engine) is driven one round per call of its step API;
:class:`StepGate` holds the worker between rounds in step mode.
Loading (or attaching to a server) goes through :func:`specchat.opening.open_backend`, as the
CLI's and the bench's do. Heavy modules (torch, transformers, specchat.models,
specchat.engine.session) are imported lazily, inside the functions, so importing the UI stays
light.

Token coalescing: the worker appends every event to an :class:`EventBuffer` and posts a
wake-up message only when none is pending and the last was at least ``WAKE_INTERVAL`` ago;
while a reply streams the UI also drains on a timer of that period. However fast the engine
is, the UI takes everything that arrived meanwhile in one go, about 15 times a second at
most. Decoding never waits for rendering, and nothing is dropped: ``ReplyClosed`` is always
posted last, and its handler drains the buffer before it closes the reply.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from specchat import logs
from specchat.engine.backend import FIGURE_LABELS, Backend, Capabilities
from specchat.engine.events import Event
from specchat.errors import SpecchatError

if TYPE_CHECKING:
    from specchat.config import Settings
    from specchat.engine.backend import Controls
    from specchat.models import LoadProgress


_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoadedBackend:
    backend: Backend
    target_name: str
    draft_name: str | None
    device: str
    notes: tuple[str, ...] = ()
    """Lines to show the user once (a server's limits)."""


LOCAL = Capabilities(kind="local", provenance="exact", measured=frozenset(FIGURE_LABELS))
"""What the local engine reports (everything, measured)."""


def capabilities_of(backend: Backend) -> Capabilities:
    """The backend's capabilities; wrappers without them (tests) count as the local engine."""
    found = getattr(backend, "capabilities", None)
    return found if isinstance(found, Capabilities) else LOCAL


WAKE_INTERVAL = 1 / 15
"""Seconds between wake-ups at most: the UI redraws the reply at most ~15 times a second
(each redraw holds the GIL the decoding thread needs between its torch calls).
The UI also drains the buffer on a timer of this period while a reply streams, so events
that arrive just after a wake-up never wait for the next round."""


class EventBuffer:
    """Events from the worker thread, waiting for the UI thread. Thread-safe.

    The worker wakes the UI only when no wake-up is pending and the last one is at least
    ``WAKE_INTERVAL`` old; events arriving meanwhile wait in the buffer for the UI's drain
    timer (same period), the next wake-up, or the final drain when the reply closes.
    """

    def __init__(self, interval: float = WAKE_INTERVAL) -> None:
        self._lock = threading.Lock()
        self._events: list[Event] = []
        self._pending = False
        self._last_wake = float("-inf")
        self.interval = interval

    def put(self, event: Event) -> bool:
        """Add an event; True when the caller should post a wake-up now."""
        with self._lock:
            self._events.append(event)
            now = time.monotonic()
            if self._pending or now - self._last_wake < self.interval:
                return False
            self._pending = True
            self._last_wake = now
            return True

    def drain(self) -> list[Event]:
        with self._lock:
            events, self._events = self._events, []
            self._pending = False
            return events


def load_backend(settings: Settings, progress: Callable[[LoadProgress], None]) -> LoadedBackend:
    """Load target and draft (every drafter stays available), or attach to the server, as the
    settings say (:func:`specchat.opening.open_backend`). Runs in a worker."""
    from specchat.opening import open_backend

    opened = open_backend(settings, progress, every_drafter=True)
    return LoadedBackend(opened.backend, opened.target_name, opened.draft_name, opened.label, opened.notes)


class StepGate:
    """Step mode, shared by the UI (which turns it on and grants rounds) and the reply's worker
    (which waits at the gate after every round). Thread-safe.

    With step mode off the gate never holds. With it on, the worker stops after each round
    until the UI grants one more (:meth:`allow_one`), step mode is turned off, or the reply is
    cancelled. Grants made while a round runs are kept, so quick presses are never lost.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._on = False
        self._grants = 0

    @property
    def on(self) -> bool:
        return self._on

    def set_on(self, on: bool) -> None:
        with self._cond:
            self._on = on
            self._grants = 0
            self._cond.notify_all()

    def allow_one(self) -> None:
        with self._cond:
            self._grants += 1
            self._cond.notify_all()

    def wait_turn(self, cancel: threading.Event, paused: Callable[[], object]) -> None:
        """Between two rounds: return at once unless step mode holds; otherwise say so once
        (``paused``) and wait for a grant, step mode off, or ``cancel``."""
        with self._cond:
            if not self._on:
                return
            if self._grants:
                self._grants -= 1
                return
        paused()
        with self._cond:
            while self._on and not self._grants and not cancel.is_set():
                self._cond.wait(0.05)
            if self._grants:
                self._grants -= 1


def run_reply(
    backend: Backend,
    messages: Sequence[dict[str, str]],
    controls: Controls,
    cancel: threading.Event,
    buffer: EventBuffer,
    wake: Callable[[], object],
    gate: StepGate | None = None,
    paused: Callable[[], object] = lambda: None,
) -> str | None:
    """Decode one reply into ``buffer``, waking the UI as needed. Runs in a worker.

    A backend that can step runs one round per call of its step API, waiting at ``gate``
    between rounds (step mode); others stream. Returns None, or a one-line error for the
    user (never a traceback).
    """

    def put_all(events: Iterable[Event]) -> None:
        for event in events:
            if buffer.put(event):
                wake()

    try:
        if gate is not None and capabilities_of(backend).stepping:
            reply = backend.start_chat(messages, controls, cancel)
            while not reply.done:
                put_all(reply.step())
                if not reply.done:
                    gate.wait_turn(cancel, paused)
        else:
            put_all(backend.stream_chat(messages, controls, cancel))
    except SpecchatError as err:
        return str(err)
    except Exception as err:  # the UI shows a line; the traceback goes to the log file
        return logs.log_unexpected("the reply failed", err)
    return None


def read_ahead(
    backend: Backend, messages: Sequence[dict[str, str]], controls: Controls, cancel: threading.Event
) -> None:
    """Let the backend read what is known of the next prompt while nobody waits
    (:meth:`specchat.engine.backend.Backend.read_ahead`). Runs in a worker; returns within one chunk of
    ``cancel`` being set or a reply starting.

    Silent: nobody asked for it, so nothing reaches the screen. An error goes to the log only
    (the reply that follows meets it again and says what is wrong)."""
    began = time.perf_counter()
    try:
        backend.read_ahead(messages, controls, cancel)
    except SpecchatError as err:
        _log.debug("reading ahead stopped: %s", err)
        return
    except Exception as err:  # a bug: its traceback goes to the log file, never to the screen
        logs.log_unexpected("reading ahead failed", err)
        return
    ms = (time.perf_counter() - began) * 1000.0
    stopped = " (cancelled)" if cancel.is_set() else ""
    _log.debug("read ahead %d messages in %.0f ms%s", len(messages), ms, stopped)
