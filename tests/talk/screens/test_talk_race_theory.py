"""Talk mode in the chat: the race screen, the theory panel with the γ advisor, the self-test screen.

Driven by the real engine over tiny seeded models; FixedTimings makes the theory panel's costs
known (a drafted token 1.5 ms, any verify pass 12 ms), so its figures can be checked exactly.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import Any, ClassVar

import pytest
from textual.widgets import Static

from specchat.config import data_dir
from specchat.engine.backend import Capabilities
from specchat.engine.events import Event
from specchat.engine.race import RaceResult
from specchat.presenters.race_text import finish_lines
from specchat.testing.scripted_engines import DRAFT_MS_PER_TOKEN, VERIFY_MS, PausingEngine
from specchat.ui.talk.race import Lane, RaceScreen
from specchat.ui.talk.selftest import SelfTestScreen
from specchat.ui.talk.theory import TheoryPanel
from specchat.ui.widgets.prompt import PromptInput
from tests.ui.conftest import make_app, send, wait_for, wait_idle

pytestmark = pytest.mark.anyio
BIG = (160, 45)


def text_of(static: Static) -> str:
    return str(static.content)


async def test_theory_panel_fills_in_the_formulas_and_applies_the_best_gamma(engine: PausingEngine) -> None:
    app = make_app(engine)
    async with app.run_test(size=BIG) as pilot:
        await send(pilot, "hello there")
        await wait_idle(pilot, app)
        await pilot.press("ctrl+y")
        panel = app.main_screen.query_one(TheoryPanel)
        # No plain reply yet: the panel runs the plain probe itself, then lets the models go.
        await wait_for(pilot, lambda: app.theory_tracker.plain_rate is not None and app.talk_task is None)
        panel.update_figures(force=True)
        view = panel.view
        assert view is not None and view.alpha is not None and view.predicted is not None
        assert view.c == pytest.approx(DRAFT_MS_PER_TOKEN / VERIFY_MS)
        assert view.v == pytest.approx(1.0)  # every verify pass costs the same under FixedTimings
        assert view.plain_rate is not None and view.plain_rate == pytest.approx(1000 / VERIFY_MS)
        reply = app.conversation.turns[-1].summary
        assert reply is not None
        assert view.measured_speedup == pytest.approx(reply.tokens_per_s / view.plain_rate)
        text = text_of(panel.query_one("#theory-text", Static))
        assert f"= {view.predicted:.2f}×" in text and f"= {view.measured_speedup:.2f}×" in text
        assert "E[T] = (1 − α^(γ+1)) / (1 − α)" in text
        # The probe is not part of the conversation.
        assert len(app.conversation.turns) == 2
        best = view.best_gamma
        assert best is not None and view.curve[best] == max(view.curve.values())
        await pilot.press("ctrl+k")
        assert app.controls is not None and app.controls.gamma == best
        await pilot.press("ctrl+y")
        assert not app.main_screen.query(TheoryPanel)


async def test_the_advisor_follows_alpha_while_the_panel_is_open(engine: PausingEngine) -> None:
    app = make_app(engine, max_new_tokens=16)
    async with app.run_test(size=BIG) as pilot:
        await pilot.press("ctrl+y")
        panel = app.main_screen.query_one(TheoryPanel)
        await wait_for(pilot, lambda: app.talk_task is None and app.theory_tracker.plain_rate is not None)
        assert panel.view is not None and panel.view.alpha is None
        await send(pilot, "hello there")
        await wait_idle(pilot, app)
        await wait_for(pilot, lambda: panel.view is not None and panel.view.alpha is not None)
        first = app.theory_tracker.version
        await send(pilot, "and again, please")
        await wait_idle(pilot, app)
        await wait_for(pilot, lambda: app.theory_tracker.version > first)


async def test_race_screen_measures_replays_in_sync_and_exports(engine: PausingEngine) -> None:
    app = make_app(engine, max_new_tokens=24)
    async with app.run_test(size=BIG) as pilot:
        await pilot.press("f11")
        screen = app.screen
        assert isinstance(screen, RaceScreen)
        await pilot.press("enter")  # the prompt box holds a default prompt
        await wait_for(pilot, lambda: screen.finished, timeout=60)
        result = screen.result
        assert result is not None and result.greedy and result.identical
        assert len(result.plain.tokens) == len(result.speculative.tokens) == 24
        assert {t.kind for t in result.plain.tokens} == {"target"}
        finish = text_of(screen.query_one("#race-finish", Static))
        assert finish == "\n".join(finish_lines(result))
        assert "identical token for token: yes, all 24 tokens" in finish
        assert app.talk_task is None
        # Mid-replay each lane shows exactly the tokens that had arrived by the clock.
        screen.t = result.duration_s / 2
        screen.draw()
        for lane in screen.query(Lane):
            assert lane._shown == result.lane(lane.lane_name).shown_at(screen.t)
        assert text_of(screen.query_one("#race-finish", Static)) == ""
        await pilot.press("e")
        folder = data_dir() / "races"
        await wait_for(pilot, lambda: any(folder.glob("*.svg")))
        saved = RaceResult.from_json(json.loads(next(folder.glob("*.json")).read_text()))
        assert saved.speculative.token_ids == result.speculative.token_ids
        assert "speed-up" in next(folder.glob("*.svg")).read_text()
        await pilot.press("escape")
        assert not isinstance(app.screen, RaceScreen)
        await send(pilot, "hello there")  # the chat has the models back
        await wait_idle(pilot, app)


@pytest.mark.slow
async def test_selftest_screen_checks_greedy_equality_then_samples_both_ways(engine: PausingEngine) -> None:
    app = make_app(engine)
    async with app.run_test(size=BIG) as pilot:
        await pilot.press("ctrl+e")
        screen = app.screen
        assert isinstance(screen, SelfTestScreen) and screen.greedy
        await wait_for(pilot, lambda: not screen.running and len(screen.checks) == 3, timeout=60)
        assert all(check.identical for check in screen.checks)
        figures = text_of(screen.query_one("#selftest-figures", Static))
        assert figures == "3 of 3 prompts identical token for token"
        await pilot.press("t")
        assert screen.temperature == 1.0 and screen.running
        await wait_for(pilot, lambda: screen.report is not None and screen.report.samples >= 60, timeout=60)
        await pilot.press("space")
        await wait_for(pilot, lambda: not screen.running)
        report = screen.report
        assert report is not None and report.settings["gamma"] == 4 and report.settings["drafter"] == "model"
        spec = text_of(screen.query_one("#hist-speculative-body", Static))
        target = text_of(screen.query_one("#hist-target-body", Static))
        top = report.rows(1)[0]
        assert f"{report.samples} samples" in spec and f"{top.speculative:>6}" in spec
        assert f"{top.target:>6}" in target
        figures = text_of(screen.query_one("#selftest-figures", Static))
        assert f"total variation distance {report.tv:.4f}" in figures and "chi-square" in figures
        assert app.talk_task is None
        await pilot.press("e")
        folder = data_dir() / "selftests"
        saved = json.loads(next(folder.glob("*.json")).read_text())
        assert saved["samples_per_lane"] == report.samples and any(folder.glob("*.svg"))
        await pilot.press("escape")
        assert not isinstance(app.screen, SelfTestScreen)


@pytest.mark.slow
async def test_switching_mode_mid_run_stops_then_switches(
    engine: PausingEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    from specchat.ui.talk import selftest as screen_module

    def slow_greedy(*args: Any, cancel: Any = None, **kwargs: Any) -> Iterator[Any]:
        cancel.wait(30)  # a real pair decoding its first prompt: the user presses T meanwhile
        return
        yield

    monkeypatch.setattr(screen_module, "greedy_equality", slow_greedy)
    app = make_app(engine)
    async with app.run_test(size=BIG) as pilot:
        await pilot.press("ctrl+e")
        screen = app.screen
        assert isinstance(screen, SelfTestScreen) and screen.greedy and screen.running
        await pilot.press("t")
        await wait_for(pilot, lambda: not screen.greedy and screen.report is not None, timeout=60)
        assert screen.running and screen.temperature == 1.0
        await pilot.press("escape")
        await wait_for(pilot, lambda: app.talk_task is None)


async def test_no_reply_starts_while_a_talk_screen_holds_the_models(engine: PausingEngine) -> None:
    app = make_app(engine)
    async with app.run_test(size=BIG) as pilot:
        assert app.lease.claim("the race")
        await send(pilot, "hello there")
        assert not app.conversation.turns
        assert app.query_one(PromptInput).text == "hello there"
        assert not app.lease.claim("the self-test")
        app.lease.release()
        await pilot.press("f11")
        assert isinstance(app.screen, RaceScreen)


class RemoteLike:
    """A backend without local models (what --server gives the app)."""

    available_drafters: ClassVar[list[str]] = []
    capabilities = Capabilities(kind="llama-server", provenance="inferred", measured=frozenset())

    def stream_chat(
        self, messages: Sequence[dict[str, str]], controls: Any, cancel: Any = None
    ) -> Iterator[Event]:
        return iter(())

    def read_ahead(self, messages: Sequence[dict[str, str]], controls: Any, cancel: Any) -> None:
        pass


async def test_a_server_gets_a_line_instead_of_the_race_and_the_selftest() -> None:
    app = make_app(RemoteLike())
    async with app.run_test(size=BIG) as pilot:
        for key in ("f11", "ctrl+e"):
            await pilot.press(key)
            assert not isinstance(app.screen, RaceScreen | SelfTestScreen)
        notes = [n.message for n in app._notifications]
        assert any("needs local models" in note for note in notes)


async def test_the_palette_lists_the_talk_actions(engine: PausingEngine) -> None:
    from specchat.ui.controllers import palette as commands

    app = make_app(engine)
    async with app.run_test(size=BIG):
        titles = [command.title for command in commands.system_commands(app, app.screen)]
    for wanted in ("Race plain against", "Theory against measurement", "Exactness self-test", "Apply the γ"):
        assert any(title.startswith(wanted) for title in titles), wanted


async def test_the_control_keys_change_the_controls_the_talk_screens_run_with(engine: PausingEngine) -> None:
    """γ, schedule, drafter and temperature keys work over the race and the self-test (their jobs
    run with the chat's controls); the chat's own keys (here F8, the Markdown view) stay with the chat."""
    app = make_app(engine, gamma=3)
    async with app.run_test(size=BIG) as pilot:
        controls = app.controls
        assert controls is not None
        await pilot.press("f11")
        assert isinstance(app.screen, RaceScreen)
        await pilot.press("f3")
        assert controls.gamma == 4
        await pilot.press("f8")
        assert not app.markdown_view
        await pilot.press("escape")
        await pilot.press("ctrl+e")
        assert isinstance(app.screen, SelfTestScreen)
        await pilot.press("f2", "f2")
        assert controls.gamma == 2
        await pilot.press("f7")
        assert controls.temperature == pytest.approx(0.1)
        await pilot.press("escape")
        await pilot.press("f8")  # back on the chat, F8 is the chat's again
        assert app.markdown_view
