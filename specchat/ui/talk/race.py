"""The race screen: plain against speculative decoding, measured, then replayed side by side.

Enter measures both lanes one after the other in a thread worker (the engine's
:func:`~specchat.engine.race.run_race`), then both lanes play back in sync at their measured
pace, and the screen says so. The finish line gives the measured speed-up, α, τ and the
exactness verdict; E saves the race as JSON (per-token times of both lanes) and as an SVG
screenshot of the screen.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, VerticalScroll
from textual.message import Message
from textual.screen import Screen
from textual.timer import Timer
from textual.widgets import Footer, Input, Static

from specchat.config import data_dir
from specchat.engine.backend import chat_messages
from specchat.engine.race import RACE_TOKENS, WARM_UP_TOKENS, LaneName, RaceCancelled, RaceResult, run_race
from specchat.engine.registry import proposes
from specchat.errors import SpecchatError
from specchat.presenters.race_text import (
    LANE_TITLES,
    REPLAY_NOTE,
    clock,
    finish_lines,
    lane_status,
    lane_text,
    settings_line,
)
from specchat.ui.settings.keys import TALK_SCREEN_KEYS, KeySpec, bindings
from specchat.ui.state.commands import CommandDispatch, Commands
from specchat.ui.state.lease import JobEnded, ModelLease, run_job
from specchat.untrusted import json_text

if TYPE_CHECKING:
    from specchat.engine.backend import Controls
    from specchat.ui.settings.themes import TokenPalette

FPS = 20
PROGRESS_INTERVAL = 0.1
"""Seconds between progress messages from the worker while the lanes are measured."""


class RaceProgressed(Message):
    def __init__(self, lane: LaneName, tokens: int) -> None:
        super().__init__()
        self.lane = lane
        self.tokens = tokens


class RaceMeasured(Message):
    def __init__(self, result: RaceResult | None, error: str | None) -> None:
        super().__init__()
        self.result = result
        self.error = error


class Lane(VerticalScroll):
    """One lane: its tokens so far, its clock and rate in the border."""

    DEFAULT_CSS = """
    Lane {
        width: 1fr;
        height: 1fr;
        border: round $primary 60%;
        border-title-style: bold;
        padding: 0 1;
    }
    Lane.-speculative { border: round $success 70%; }
    """

    def __init__(self, name: LaneName) -> None:
        super().__init__(id=f"lane-{name}", classes=f"-{name}")
        self.lane_name = name
        self.border_title = LANE_TITLES[name]
        self._shown = -1

    def compose(self) -> ComposeResult:
        yield Static(markup=False, classes="lane-text")

    def show(self, result: RaceResult | None, t: float, styles: dict[str, Any]) -> None:
        if result is None:
            self._shown = -1
            self.query_one(".lane-text", Static).update("")
            self.border_subtitle = ""
            return
        lane = result.lane(self.lane_name)
        self.border_subtitle = lane_status(lane, t)
        count = lane.shown_at(t)
        if count != self._shown:
            self._shown = count
            self.query_one(".lane-text", Static).update(lane_text(lane, t, styles))
            self.scroll_end(animate=False)


class RaceScreen(CommandDispatch, Screen[None]):
    """The race, full screen; Esc returns to the chat."""

    KEY_TABLE: ClassVar[tuple[KeySpec, ...]] = TALK_SCREEN_KEYS
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "close", "Back to the chat"),
        Binding("r", "replay", "Replay"),
        Binding("e", "export", "Export SVG + JSON"),
        Binding("n", "edit_prompt", "New race"),
        # The app-wide keys (help first) and the controls this screen's job runs with.
        *bindings(TALK_SCREEN_KEYS, on_screen=True),
    ]
    DEFAULT_CSS = """
    RaceScreen { layout: vertical; }
    RaceScreen #race-title { height: 1; padding: 0 1; background: $primary 30%; text-style: bold; }
    RaceScreen #race-prompt { margin: 0 1; }
    RaceScreen #race-note { padding: 0 1; color: $warning; text-style: italic; }
    RaceScreen #race-clock { padding: 0 1; color: $text-muted; }
    RaceScreen #race-lanes { height: 1fr; }
    RaceScreen #race-finish {
        height: auto; min-height: 3; padding: 0 1; text-style: bold; border-top: solid $primary 50%;
    }
    """

    def __init__(
        self,
        prompt: str,
        result: RaceResult | None = None,
        *,
        lease: ModelLease | None = None,
        palette: TokenPalette | None = None,
        system_prompt: Callable[[], str | None] = lambda: None,
        commands: Commands | None = None,
    ) -> None:
        """``lease`` runs the race on the models (None: a saved race, shown only); ``palette``
        colours the tokens; ``system_prompt`` is read when a race starts, as the chat's may
        change while this screen is open; ``commands`` runs the control keys on the chat's
        controls, which the next run uses."""
        super().__init__()
        self.commands = commands if commands is not None else Commands()
        """The chat's γ, schedule, drafter and temperature commands (none: keys shown, ignored)."""
        self.prompt = prompt
        self.result: RaceResult | None = result
        self.lease = lease
        self.palette = palette
        self.system_prompt = system_prompt
        self.measured: RaceResult | None = None
        """Written by the race's worker thread, read when its JobEnded arrives."""
        self.measuring = False
        self.replay_start = 0.0
        self.replay_timer: Timer | None = None
        self.t = result.duration_s if result is not None else 0.0

    def compose(self) -> ComposeResult:
        yield Static(
            "The race: plain decoding against speculative decoding, same prompt, same settings",
            id="race-title",
            markup=False,
        )
        yield Input(self.prompt, placeholder="Prompt for the race; Enter starts it", id="race-prompt")
        yield Static(REPLAY_NOTE, id="race-note", markup=False)
        yield Static(id="race-clock", markup=False)
        with Horizontal(id="race-lanes"):
            yield Lane("plain")
            yield Lane("speculative")
        yield Static(id="race-finish", markup=False)
        yield Footer()

    def on_mount(self) -> None:
        if self.result is not None:
            self.draw()
            self.query_one("#lane-speculative", Lane).focus()
        else:
            self.query_one("#race-clock", Static).update(self.idle_line())
            self.query_one(Input).focus()

    def idle_line(self) -> str:
        controls = self.controls
        if controls is None:
            return "The models are still loading."
        tokens = min(controls.max_new_tokens, RACE_TOKENS)
        return (
            f"Enter starts: plain, then speculative (γ {controls.gamma} {controls.schedule}, drafter "
            f"{controls.drafter}, T {controls.temperature:g}), {tokens} tokens each, then the replay."
        )

    @property
    def controls(self) -> Controls | None:
        return self.lease.controls if self.lease is not None else None

    # ------------------------------------------------------------------ measuring

    @on(Input.Submitted, "#race-prompt")
    def start(self, event: Input.Submitted) -> None:
        prompt = event.value.strip()
        if self.measuring:
            return
        if not prompt:
            self.notify("Type a prompt for the race first.", severity="warning")
            return
        lease = self.lease
        controls = self.controls
        backend = lease.local if lease is not None else None
        if lease is None or controls is None or backend is None:
            self.notify("The race needs the local models, loaded.", severity="warning")
            return
        if not proposes(controls.drafter):
            self.notify(
                "The drafter is none: both lanes would be plain decoding. F5 picks a drafter.",
                severity="warning",
            )
            return
        race_controls = replace(controls, max_new_tokens=min(controls.max_new_tokens, RACE_TOKENS))
        messages = chat_messages(self.system_prompt(), prompt)
        models = {"target": lease.target_name, "draft": lease.draft_name}
        job = self.race_job(backend, messages, race_controls, models)
        if not run_job(self, lease, "the race", job, name="race"):
            self.notify(lease.busy_reason() or "The models are busy.", severity="warning")
            return
        self.prompt = prompt
        self.result = self.measured = None
        self.measuring = True
        self.stop_replay()
        self.draw()
        self.query_one("#race-clock", Static).update("measuring the plain lane…")
        self.query_one("#lane-speculative", Lane).focus()

    def race_job(
        self,
        backend: Any,
        messages: list[dict[str, str]],
        controls: Controls,
        models: dict[str, Any],
    ) -> Callable[[threading.Event], None]:
        """Both lanes, measured in the worker thread; progress comes back as messages."""
        last = [0.0]

        def progress(lane: LaneName, tokens: int) -> None:
            now = time.monotonic()
            if now - last[0] >= PROGRESS_INTERVAL:
                last[0] = now
                self.post_message(RaceProgressed(lane, tokens))

        def job(cancel: threading.Event) -> None:
            try:
                self.measured = run_race(
                    backend,
                    messages,
                    controls,
                    progress=progress,
                    cancel=cancel,
                    warm_up_tokens=WARM_UP_TOKENS,
                    models=models,
                )
            except RaceCancelled as err:  # stopped: said as one line, like an error
                raise SpecchatError(str(err)) from err

        return job

    def on_job_ended(self, message: JobEnded) -> None:
        self.post_message(RaceMeasured(self.measured, message.error))

    def on_race_progressed(self, message: RaceProgressed) -> None:
        if self.measuring:
            self.query_one("#race-clock", Static).update(
                f"measuring the {message.lane} lane: {message.tokens} tokens (the replay follows)"
            )

    def on_race_measured(self, message: RaceMeasured) -> None:
        self.measuring = False
        if message.result is None:
            self.query_one("#race-clock", Static).update(f"the race did not finish: {message.error}")
            self.notify(message.error or "the race did not finish", severity="error")
            return
        self.result = message.result
        self.action_replay()

    # ------------------------------------------------------------------ the replay

    def action_replay(self) -> None:
        if self.result is None or self.measuring:
            return
        self.stop_replay()
        self.replay_start = time.monotonic()
        self.t = 0.0
        self.draw()
        self.replay_timer = self.set_interval(1 / FPS, self.tick)

    def tick(self) -> None:
        if self.result is None:
            return
        self.t = time.monotonic() - self.replay_start
        if self.t >= self.result.duration_s:
            self.t = self.result.duration_s
            self.stop_replay()
        self.draw()

    def stop_replay(self) -> None:
        if self.replay_timer is not None:
            self.replay_timer.stop()
            self.replay_timer = None

    def draw(self) -> None:
        result = self.result
        styles = dict(self.palette.styles) if self.palette is not None else {}
        for lane in self.query(Lane):
            lane.show(result, self.t, styles)
        finish = self.query_one("#race-finish", Static)
        if result is None:
            finish.update("")
            return
        self.query_one("#race-clock", Static).update(f"{clock(result, self.t)} · {settings_line(result)}")
        if self.t >= result.duration_s:
            finish.update("\n".join(finish_lines(result)))
        else:
            finish.update("")

    @property
    def finished(self) -> bool:
        return self.result is not None and self.t >= self.result.duration_s

    # ------------------------------------------------------------------ export, close

    def action_export(self) -> None:
        if self.result is None:
            self.notify("Run a race first (Enter in the prompt box).")
            return
        if not self.finished:
            self.t = self.result.duration_s
            self.stop_replay()
            self.draw()
        folder = data_dir() / "races"
        stem = "race-" + time.strftime("%Y%m%d-%H%M%S")
        try:
            folder.mkdir(parents=True, exist_ok=True)
            json_path = folder / f"{stem}.json"
            json_path.write_text(json_text(self.result.to_json(), indent=1) + "\n", encoding="utf-8")
        except OSError as err:
            self.notify(f"cannot export the race: {err.strerror or err} ({folder})", severity="error")
            return
        self.call_after_refresh(self._save_svg, folder, stem, json_path)

    def _save_svg(self, folder: Path, stem: str, json_path: Path) -> None:
        try:
            svg = self.app.save_screenshot(f"{stem}.svg", str(folder))
        except OSError as err:
            self.notify(f"saved {json_path}, but not the SVG: {err.strerror or err}", severity="error")
            return
        self.notify(f"{svg}\n{json_path}", title="race exported", timeout=12)

    def action_edit_prompt(self) -> None:
        self.query_one(Input).focus()

    def action_close(self) -> None:
        self.stop_replay()
        self.workers.cancel_group(self, "talk")  # the race stops at the next round boundary
        self.dismiss(None)
