"""Talk mode, part 2: the race, theory against measurement and the exactness self-test in the chat.

The app's actions call these functions, so the app itself only gains a binding and a one-line
action per feature. The engine work (race, self-test, plain probe) runs in thread workers owned
by the screens and the panel; :func:`claim` and :func:`release_from_thread` make sure only one of
them, or a chat reply, uses the models at a time (the engine is not thread-safe).
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

from textual.css.query import NoMatches

from specchat.ui.theory import TheoryTracker

if TYPE_CHECKING:
    from specchat.ui.app import SpecchatApp

POLL_S = 0.5
"""Seconds between the tracker's looks at the live statistics (a timer, never per token)."""


def attach(app: SpecchatApp) -> None:
    """Follow what the chat measures from the start, so the theory panel knows this session."""
    tracked = TheoryTracker(app.live)
    app.theory_tracker = tracked
    app.set_interval(POLL_S, tracked.poll)


def tracker(app: SpecchatApp) -> TheoryTracker:
    if app.theory_tracker is None:
        attach(app)
    assert app.theory_tracker is not None
    return app.theory_tracker


# ----------------------------------------------------------------------------- using the models


def local_engine(engine: Any) -> Any | None:
    """The local ChatEngine behind ``engine`` (tests wrap it), or None for a server.

    The race and the self-test need token ids, the plain reference decoder and the caches, which
    only the local engine has.
    """
    seen = 0
    while engine is not None and seen < 8:
        if hasattr(engine, "stream_plain") and hasattr(engine, "prompt_ids"):
            return engine
        engine = getattr(engine, "engine", None)
        seen += 1
    return None


def busy_reason(app: SpecchatApp) -> str | None:
    """Why the models cannot take another job right now (None: they are free)."""
    if app.engine is None or app.controls is None:
        return "The models are still loading."
    if app.reply is not None:
        return "A reply is streaming: press Esc to stop it first."
    task = getattr(app, "talk_task", None)
    if task:
        return f"{task[0].upper()}{task[1:]} is using the models: wait for it, or close its screen."
    return None


def claim(app: SpecchatApp, task: str) -> bool:
    """Reserve the models for ``task`` ("the race", …); False when something else holds them."""
    if busy_reason(app) is not None:
        return False
    app.talk_task = task
    with contextlib.suppress(NoMatches):
        app._hold_prompt()
    return True


def release_from_thread(app: Any) -> None:
    """Free the models from the worker thread that held them (an attribute write is atomic)."""
    app.talk_task = None
    with contextlib.suppress(Exception):  # the app may be closing
        app.call_from_thread(_rehold, app)


def _rehold(app: SpecchatApp) -> None:
    with contextlib.suppress(NoMatches):
        app._hold_prompt()


# ----------------------------------------------------------------------------- the actions


def toggle_theory(app: SpecchatApp) -> None:
    from specchat.ui.widgets.theory import TheoryPanel

    screen = app.main_screen
    try:
        screen.query_one(TheoryPanel).remove()
        return
    except NoMatches:
        pass
    screen.mount(TheoryPanel(tracker(app), key_of(app, "best_gamma")))


def apply_best_gamma(app: SpecchatApp) -> None:
    controls = app.controls
    if controls is None:
        return
    view = tracker(app).view(controls.gamma, controls.drafter)
    if view.best_gamma is None:
        app.notify("The γ advisor needs α, c and v(γ) measured first: send a message with drafting on.")
        return
    before = controls.gamma
    controls.gamma = view.best_gamma  # one attribute write: the engine reads γ once per round
    note = f"γ {before} → {view.best_gamma}: predicted {view.curve[view.best_gamma]:.2f}×"
    if controls.schedule != "fixed":
        note += f" (the {controls.schedule} schedule starts there and picks γ per round)"
    app.notify(note, title="γ advisor")
    app.refresh_panels(force=True)


def open_race(app: SpecchatApp) -> None:
    from specchat.ui.screens.race import RaceScreen

    if isinstance(app.screen, RaceScreen) or not _can_open(app, "the race"):
        return
    app.push_screen(RaceScreen(default_prompt(app)))


def open_selftest(app: SpecchatApp) -> None:
    from specchat.ui.screens.selftest import SelfTestScreen

    if isinstance(app.screen, SelfTestScreen) or not _can_open(app, "the self-test"):
        return
    app.push_screen(SelfTestScreen())


def _can_open(app: SpecchatApp, what: str) -> bool:
    if app.engine is not None and local_engine(app.engine) is None:
        app.notify(
            f"{what[0].upper()}{what[1:]} needs local models (it counts token ids and times every "
            "token itself); a server does not report them.",
            severity="warning",
        )
        return False
    reason = busy_reason(app)
    if reason is not None:
        app.notify(reason, severity="warning")
        return False
    return True


def default_prompt(app: SpecchatApp) -> str:
    """The race's prompt: the last message sent, else a code prompt that drafts well."""
    for turn in reversed(app.conversation.turns):
        if turn.role == "user" and turn.content.strip():
            return turn.content
    return "Write a Python function that checks whether a number is prime."


def key_of(app: SpecchatApp, binding_id: str) -> str:
    from specchat.ui import keys

    return keys.display_key(app.effective_keys.get(binding_id, ""))
