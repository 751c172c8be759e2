"""Snapshots of the talk screens at a fixed size, from the real app and the real engine.

A race's timings and a self-test's duration are measured, so these pictures fix them: the race's
tokens come from the tiny engine, their arrival times from a cost model (race_with_fixed_times,
as FixedTimings does for the chat); the self-test's counts are real (seeded), its elapsed time
fixed. The theory panel needs nothing fixed: FixedTimings already gives the chat fixed costs.
Update after an intended change with: pytest tests/talk/screens/test_talk_snapshots.py --snapshot-update
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from textual.pilot import Pilot

from specchat.engine.backend import Controls
from specchat.engine.race import RaceResult, run_race
from specchat.engine.selftest import ExactnessSampler, selftest_messages
from specchat.engine.session import ChatEngine
from specchat.testing.scripted_engines import PausingEngine, race_with_fixed_times
from specchat.testing.tiny_models import TinyPair
from specchat.ui.talk.race import RaceScreen
from specchat.ui.talk.selftest import SelfTestScreen
from specchat.ui.talk.theory import TheoryPanel
from tests.ui.conftest import SIZE, make_app, send, wait_for, wait_idle, whole_chains


@pytest.fixture
def fixed_race(tiny_pair: TinyPair) -> RaceResult:
    engine = whole_chains(ChatEngine(tiny_pair.target, tiny_pair.tokenizer, tiny_pair.draft))
    messages = [{"role": "user", "content": "the cat sat on the mat"}]
    raw = run_race(engine, messages, Controls(gamma=4, drafter="model", max_new_tokens=48, seed=1))
    return replace(
        race_with_fixed_times(raw),
        models={"target": "tiny-target", "draft": "tiny-draft"},
        measured_at="2026-12-01T12:00:00+0000",
    )


def test_race_finish_line(snap_compare: Any, engine: PausingEngine, fixed_race: RaceResult) -> None:
    app = make_app(engine)

    async def run_before(pilot: Pilot[Any]) -> None:
        await app.push_screen(RaceScreen("the cat sat on the mat", result=fixed_race, palette=app.palette))
        await pilot.pause()

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)


def test_race_mid_replay(snap_compare: Any, engine: PausingEngine, fixed_race: RaceResult) -> None:
    """Half way: the speculative lane is ahead, and the finish line is not shown yet."""
    app = make_app(engine)

    async def run_before(pilot: Pilot[Any]) -> None:
        screen = RaceScreen("the cat sat on the mat", result=fixed_race, palette=app.palette)
        await app.push_screen(screen)
        screen.t = fixed_race.duration_s / 2
        screen.draw()
        await pilot.pause()

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)


THEORY_SIZE = (160, 45)
"""A talk's terminal: the panel's text and both plots side by side (at 120 columns the plots
lose their titles)."""


def test_theory_panel_with_the_advisor(snap_compare: Any, engine: PausingEngine) -> None:
    """The formulas, the cost plot (v(γ) beside the seed's v = 1 and the break-even line) and the
    advisor's speed-up curve, after replies at γ 4 and γ 2."""
    app = make_app(engine)

    async def run_before(pilot: Pilot[Any]) -> None:
        await pilot.press("f12")  # a talk shows the rejected drafts (off for chatting)
        await send(pilot, "hello there")
        await wait_idle(pilot, app)
        await pilot.press("f2", "f2")  # a second width timed: the cost plot draws a line
        await send(pilot, "and again")
        await wait_idle(pilot, app)
        await pilot.press("ctrl+y")
        await wait_for(pilot, lambda: app.theory_tracker.plain_rate is not None and app.talk_task is None)
        app.main_screen.query_one(TheoryPanel).update_figures(force=True)
        app.refresh_panels(force=True)
        await pilot.pause()

    assert snap_compare(app, terminal_size=THEORY_SIZE, run_before=run_before)


@pytest.mark.slow
def test_selftest_histograms(snap_compare: Any, engine: PausingEngine, tiny_pair: TinyPair) -> None:
    local = whole_chains(ChatEngine(tiny_pair.target, tiny_pair.tokenizer, tiny_pair.draft))
    sampler = ExactnessSampler(
        # Seed 0's first 400 samples fall in the verdict's false-alarm tail since sampling draws by
        # inverse CDF (chi-square p = 0.003; its first 4000 give p = 0.80): the screen is shown on another.
        local,
        selftest_messages(),
        Controls(gamma=4, drafter="model", temperature=1.0),
        tokens=1,
        seed=1000,
    )
    report = replace(sampler.run(400), elapsed_s=20.0)
    app = make_app(engine)

    async def run_before(pilot: Pilot[Any]) -> None:
        screen = SelfTestScreen(temperature=1.0, autostart=False, lease=app.lease)
        await app.push_screen(screen)
        screen.report = report
        screen.draw()
        await pilot.pause()

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)
