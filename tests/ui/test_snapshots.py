"""Snapshots of the real app at a fixed size, with deterministic generation.

Temperature 0 and a fixed seed make the tiny models' replies repeatable, and FixedTimings
replaces measured timings with a cost model, so tokens/s is the same on every machine.
Update after an intended change with: pytest tests/ui/test_snapshots.py --snapshot-update
"""

from __future__ import annotations

from typing import Any

import pytest
from textual.pilot import Pilot

from specchat.testing.scripted_engines import PausingEngine

from .conftest import SIZE, make_app, send, wait_for, wait_idle, wait_paused


def test_main_screen_mid_reply(snap_compare: Any, engine: PausingEngine) -> None:
    """A reply paused after its tenth round: coloured tokens, the cursor, every panel live."""
    engine.pause_after = 9
    app = make_app(engine)

    async def run_before(pilot: Pilot[Any]) -> None:
        await send(pilot, "hello there")
        await wait_paused(pilot, app, engine)
        app.refresh_panels(force=True)
        await pilot.pause()

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)


def test_help_screen(snap_compare: Any, engine: PausingEngine) -> None:
    app = make_app(engine)
    assert snap_compare(app, terminal_size=SIZE, press=["f1"])


@pytest.mark.slow
@pytest.mark.parametrize(
    "theme", ["specchat-dark", "specchat-light", "specchat-projector", "specchat-colorblind"]
)
def test_theme(snap_compare: Any, engine: PausingEngine, theme: str) -> None:
    """A finished reply and its figures in each packaged theme."""
    app = make_app(engine, theme=theme)

    async def run_before(pilot: Pilot[Any]) -> None:
        await pilot.press("f12")  # a talk shows the rejected drafts (off for chatting)
        await send(pilot, "hello there")
        await wait_idle(pilot, app)
        app.refresh_panels(force=True)
        await pilot.pause()

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)


def test_inspector_on_a_correction(snap_compare: Any, engine: PausingEngine) -> None:
    """The token inspector on a reply's first correction: the draft it replaced, the top 5."""
    app = make_app(engine)

    async def run_before(pilot: Pilot[Any]) -> None:
        await pilot.press("f12")  # a talk shows the rejected drafts (off for chatting)
        await send(pilot, "hello there")
        await wait_idle(pilot, app)
        tokens = app.conversation.turns[-1].tokens
        index = next(i for i, t in enumerate(tokens) if t.kind == "correction" and t.text)
        app.main_screen.inspector.inspect_token(0, index)
        await pilot.pause()
        app.refresh_panels(force=True)

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)


def test_step_mode_paused_after_the_first_round(snap_compare: Any, engine: PausingEngine) -> None:
    """Step mode holds the reply after a round and tabulates it."""
    app = make_app(engine)

    async def run_before(pilot: Pilot[Any]) -> None:
        await pilot.press("f12")  # a talk shows the rejected drafts (off for chatting)
        await pilot.press("ctrl+g")
        await send(pilot, "hello there")
        await wait_for(pilot, lambda: app.live.step.paused)
        await pilot.press("ctrl+n")
        await wait_for(
            pilot, lambda: app.live.step.paused and app.reply is not None and len(app.reply.rounds) == 2
        )
        app.clear_notifications()
        app.refresh_panels(force=True)
        await pilot.pause()

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)
