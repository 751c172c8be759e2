"""Who may use the models right now: the chat's reply, or one talk job (race, self-test, probe).

The engine is not thread-safe, so at most one job runs on it at a time. The app creates one
:class:`ModelLease` and hands it to the screens and panels that run jobs on the models; they
claim it, run their job in a thread worker (:func:`run_job`), and release it however the job
ends. Every change of holder calls the app's ``on_change`` (the app re-holds the message box),
so nothing below the app needs to know the app.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from textual.message import Message
from textual.widget import Widget
from textual.worker import get_current_worker

from specchat.engine.backend import LocalBackend, Wrapper
from specchat.errors import SpecchatError
from specchat.ui.workers import bridge

if TYPE_CHECKING:
    from specchat.engine.backend import Capabilities, Controls

MAX_WRAPPERS = 8
"""How many ``.backend`` wrappers :func:`local_backend` looks through. Tests wrap the engine to
slow it down or retime it, and a server client may wrap a transport: one or two levels in
practice. The bound only stops a wrapper that points at itself from looping for ever."""


def local_backend(backend: object) -> LocalBackend | None:
    """The local backend behind ``backend`` (tests wrap it), or None for a server.

    The race and the self-test need token ids and the plain reference decoder, which only local
    models have (:class:`~specchat.engine.backend.LocalBackend`); it is recognised by that interface, not
    by the engine's class, so this module loads no torch.
    """
    for _ in range(MAX_WRAPPERS + 1):
        if isinstance(backend, LocalBackend):
            return backend
        if not hasattr(backend, "backend"):
            return None
        backend = cast(Wrapper, backend).backend
    return None


class ModelLease:
    """The models, once loaded, and who holds them.

    ``task`` is written by the UI thread on claim and by a worker thread on release: a single
    attribute write, atomic under the GIL, and the UI thread then re-reads it.
    """

    def __init__(
        self,
        on_change: Callable[[], None],
        call_from_thread: Callable[[Callable[[], None]], object],
    ) -> None:
        self._on_change = on_change
        self._call_from_thread = call_from_thread
        self.backend: Any | None = None
        """The backend the chat streams from (the local engine or a server client)."""
        self.controls: Controls | None = None
        self.target_name: str | None = None
        self.draft_name: str | None = None
        self.task: str | None = None
        """What a talk job runs on the models ("the race", …), so no reply starts meanwhile."""
        self.streaming = False
        """A chat reply is streaming (set by the reply's owner)."""

    def use(self, backend: Any, controls: Controls, target_name: str | None, draft_name: str | None) -> None:
        """The models have loaded (or the server answered)."""
        self.backend, self.controls = backend, controls
        self.target_name, self.draft_name = target_name, draft_name

    @property
    def loaded(self) -> bool:
        return self.backend is not None and self.controls is not None

    @property
    def capabilities(self) -> Capabilities | None:
        """What the backend reports, measures and lets the user control; None while loading."""
        return bridge.capabilities_of(self.backend) if self.backend is not None else None

    @property
    def local(self) -> LocalBackend | None:
        """The local engine, or None while loading and for a server."""
        return local_backend(self.backend)

    def busy_reason(self) -> str | None:
        """Why the models cannot take another job right now (None: they are free)."""
        if not self.loaded:
            return "The models are still loading."
        if self.streaming:
            return "A reply is streaming: press Esc to stop it first."
        if self.task:
            who = f"{self.task[0].upper()}{self.task[1:]}"
            return f"{who} is using the models: wait for it, or close its screen."
        return None

    def send_refusal(self) -> str | None:
        """Why the chat's message box cannot send now (None: it can); the message stays in the box."""
        if not self.loaded:
            return "The models are still loading: your message stays in the box."
        if self.streaming:
            return "A reply is streaming: Esc stops it. Your message stays in the box."
        if self.task:
            return f"The models are busy with {self.task}: your message stays in the box."
        return None

    def changed(self) -> None:
        """Tell the owner the models' state changed (they loaded, a job ended)."""
        self._on_change()

    def claim(self, task: str) -> bool:
        """Reserve the models for ``task``; False when something else holds them."""
        if self.busy_reason() is not None:
            return False
        self.task = task
        self._on_change()
        return True

    def release(self) -> None:
        """Free the models (UI thread)."""
        self.task = None
        self._on_change()

    def release_from_thread(self) -> None:
        """Free the models from the worker thread that held them."""
        self.task = None
        with contextlib.suppress(Exception):  # the app may be closing
            self._call_from_thread(self._on_change)


class JobEnded(Message):
    """A job run by :func:`run_job` has ended; ``error`` is one line, or None."""

    def __init__(self, task: str, error: str | None) -> None:
        super().__init__()
        self.task = task
        self.error = error


Job = Callable[[threading.Event], None]
"""Work on the models, run in a thread; it stops soon after the event is set."""


def run_job(owner: Widget, lease: ModelLease, task: str, job: Job, name: str) -> bool:
    """Claim ``lease`` for ``task`` and run ``job`` in a thread worker of ``owner``.

    However the job ends (done, cancelled, failed), the lease is released and ``owner`` gets
    one :class:`JobEnded`. False, and nothing run, when the models are busy.
    """
    if not lease.claim(task):
        return False
    owner.run_worker(
        lambda: _run_to_the_end(owner, lease, task, job),
        name=name,
        group="talk",
        thread=True,
        exit_on_error=False,
    )
    return True


def _run_to_the_end(owner: Widget, lease: ModelLease, task: str, job: Job) -> None:
    error = None
    try:
        job(get_current_worker().cancelled_event)
    except SpecchatError as err:
        error = str(err)
    except Exception as err:  # one line for the user; the traceback goes to the log file
        from specchat import logs

        error = logs.log_unexpected(f"{task} failed", err)
    finally:
        lease.release_from_thread()
    # post_message is thread-safe, and reaches a screen that has closed meanwhile harmlessly.
    owner.post_message(JobEnded(task, error))
