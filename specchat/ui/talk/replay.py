"""Replay a saved conversation round by round, at the pace it was recorded, with no model.

The chat screen's layout (transcript, inspector, step table, legend, panels) over a
saved conversation: each user message appears, then its reply's rounds arrive one by one,
each after the milliseconds it took when it was recorded (its draft plus verify time), scaled
by the speed (×0.25 to ×4). Space pauses and plays, N runs one round, +/− change the speed,
R starts again, Esc closes. While paused, the step table shows the last round.

Conversations saved before the trace existed replay too: their tokens and colours, without
rejected drafts or probabilities. Rounds without recorded timings (a server) take the reply's
average round time, or :data:`DEFAULT_ROUND_MS`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.screen import Screen
from textual.timer import Timer
from textual.widgets import Static

from specchat.engine.events import Event, RoundEvent, SummaryEvent, TokenEvent, known
from specchat.store.conversation import Conversation, Turn
from specchat.ui.screens.main import MainScreen
from specchat.ui.settings.keys import APP_KEYS, bindings, display_key
from specchat.ui.settings.themes import TokenPalette
from specchat.ui.state.commands import Commands
from specchat.ui.state.live import ControlsView, LiveStats, StepView, replay
from specchat.ui.widgets.inspector import shown_round, shown_token
from specchat.ui.widgets.transcript import AssistantMessage, UserMessage
from specchat.untrusted import visible

SPEEDS = (0.25, 0.5, 1.0, 2.0, 4.0)
DEFAULT_ROUND_MS = 60.0
"""A round's pace when the file recorded none and the reply has no decode time either."""
READING_PAUSE_S = 0.8
"""Before each reply: time to read the question (not recorded; scaled by the speed too)."""
MIN_DELAY_S = 0.01


@dataclass
class ReplayStep:
    """One thing the replay shows: a user message, a reply beginning, one round, a reply ending."""

    what: str
    """"user", "start", "round" or "end"."""
    turn: Turn
    delay_s: float
    """Seconds (at ×1) before this step shows."""
    events: list[Event] = field(default_factory=list)


def replay_steps(conversation: Conversation) -> list[ReplayStep]:
    """The conversation as a timed script: messages, then each reply round by round."""
    steps: list[ReplayStep] = []
    for turn in conversation.turns:
        if turn.role == "user":
            steps.append(ReplayStep("user", turn, 0.0 if not steps else READING_PAUSE_S / 2))
            continue
        summary = turn.summary
        prefill_s = summary.prefill_ms / 1000.0 if summary is not None and known(summary.prefill_ms) else 0.0
        steps.append(ReplayStep("start", turn, READING_PAUSE_S + prefill_s))
        rounds = rounds_of(turn)
        fallback_ms = DEFAULT_ROUND_MS
        if summary is not None and summary.rounds and summary.decode_s > 0:
            fallback_ms = summary.decode_s * 1000.0 / summary.rounds
        for events in rounds:
            steps.append(ReplayStep("round", turn, round_ms(events, fallback_ms) / 1000.0, events))
        steps.append(ReplayStep("end", turn, 0.0))
    return steps


def rounds_of(turn: Turn) -> list[list[Event]]:
    """A saved reply's events grouped by round: each round's tokens, then its RoundEvent."""
    groups: list[list[Event]] = []
    current: list[Event] = []
    for event in replay(turn):
        if isinstance(event, SummaryEvent):
            continue
        last = current[-1] if current else None
        if isinstance(event, TokenEvent) and isinstance(last, TokenEvent) and last.round != event.round:
            groups.append(current)  # a reply saved without its rounds: split at round numbers
            current = []
        current.append(event)
        if isinstance(event, RoundEvent):
            groups.append(current)
            current = []
    if current:
        groups.append(current)
    return groups


def round_ms(events: list[Event], fallback_ms: float) -> float:
    for event in events:
        if isinstance(event, RoundEvent):
            ms = event.draft_ms + event.verify_ms
            return ms if known(ms) and ms > 0 else fallback_ms
    return fallback_ms


class ReplayScreen(MainScreen, inherit_bindings=False):
    """A saved conversation, replayed (see the module's docstring). The chat's keys work here as
    on the chat, but step mode's commands pause (play) and step the replay; the footer lists the
    replay's own keys first (so it lists its bindings whole, the chat's after its own)."""

    BINDINGS: ClassVar[list[BindingType]] = [
        *Screen.BINDINGS,
        Binding("space", "toggle_playing", "Pause/Play"),
        Binding("n", "step_round", "Next round"),
        Binding("plus,equals_sign", "faster", "Faster"),
        Binding("minus", "slower", "Slower"),
        Binding("r", "restart", "Restart"),
        Binding("escape,q", "close", "Close"),
        *bindings(APP_KEYS, on_screen=True),
    ]

    def __init__(
        self,
        conversation: Conversation,
        palette: TokenPalette,
        keys: Mapping[str, str],
        *,
        commands: Commands,
        speed: float = 1.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(LiveStats(), palette, conversation.system_prompt, commands=commands, **kwargs)
        # Step mode's keys pause (play) the replay and show its next round.
        self.commands.add("toggle_step_mode", self.toggle_playing)
        self.commands.add("step", self.step_round)
        self.conversation = conversation
        self.steps = replay_steps(conversation)
        self.speed = min(SPEEDS, key=lambda s: abs(s - speed))
        self.position = 0
        """Index of the next step to show."""
        self.playing = True
        self._timer: Timer | None = None
        self._playing_reply: AssistantMessage | None = None
        self._turn: Turn | None = None
        self.live.set_display(
            keys={**keys, "step": "n", "step_mode": "space"}, show_rejected=palette.show_rejected
        )
        self._update_controls()

    def compose_input(self) -> ComposeResult:
        yield Static(id="replay-bar")

    def on_mount(self) -> None:
        # MainScreen's on_mount runs too (Textual calls each class's handler).
        self.sub_title = f"replay · {visible(self.conversation.title)}"  # a shared file's words
        self._show_bar()
        self._schedule()

    # ------------------------------------------------------------- controls

    @property
    def finished(self) -> bool:
        return self.position >= len(self.steps)

    def action_toggle_playing(self) -> None:
        self.toggle_playing()

    def toggle_playing(self) -> None:
        if self.finished:
            return
        self.playing = not self.playing
        if self.playing:
            self.live.set_step(StepView())
            self._schedule()
        else:
            self._cancel_timer()
            self._show_paused()
        self._show_bar()
        self.refresh_panels()

    def action_step_round(self) -> None:
        self.step_round()

    def step_round(self) -> None:
        """Pause, and show everything up to and including the next round."""
        self._cancel_timer()
        self.playing = False
        while not self.finished:
            step = self.steps[self.position]
            self._show_next()
            if step.what == "round":
                break
        # A reply's last round also ends the reply: show its figures at once.
        if not self.finished and self.steps[self.position].what == "end":
            self._show_next()
        self._show_paused()
        self._show_bar()
        self.refresh_panels()

    def action_faster(self) -> None:
        self._set_speed(+1)

    def action_slower(self) -> None:
        self._set_speed(-1)

    def _set_speed(self, direction: int) -> None:
        index = SPEEDS.index(self.speed) + direction
        self.speed = SPEEDS[max(0, min(len(SPEEDS) - 1, index))]
        self._update_controls()
        if self.playing:
            self._schedule()
        self._show_bar()
        self.refresh_panels()

    async def action_restart(self) -> None:
        self._cancel_timer()
        self.position = 0
        self._playing_reply = None
        self._turn = None
        self.inspector.stop_inspecting()
        self.live.reset()
        self.live.set_step(StepView())
        await self.transcript.remove_children(UserMessage)
        await self.transcript.remove_children(AssistantMessage)
        self.playing = True
        self._show_bar()
        self._schedule()

    def action_close(self) -> None:
        self._cancel_timer()
        self.dismiss(None)

    # ------------------------------------------------------------- playing

    def _schedule(self) -> None:
        self._cancel_timer()
        if self.finished or not self.playing:
            return
        delay = max(MIN_DELAY_S, self.steps[self.position].delay_s / self.speed)
        self._timer = self.set_timer(delay, self._advance)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.stop()
            self._timer = None

    def _advance(self) -> None:
        self._timer = None
        if not self.playing or self.finished:
            return
        self._show_next()
        self._show_bar()
        self._schedule()

    def _show_next(self) -> None:
        step = self.steps[self.position]
        self.position += 1
        if step.what == "user":
            self.transcript.mount(UserMessage(step.turn.content))
            self.transcript.follow_new_reply()
        elif step.what == "start":
            self._turn = step.turn
            self._playing_reply = self.new_reply(markdown=False)
            self.live.start_reply()
            self._update_controls()
        elif step.what == "round" and self._playing_reply is not None:
            self.live.extend(step.events)
            self.show_events(self._playing_reply, [e for e in step.events if not isinstance(e, SummaryEvent)])
        elif step.what == "end" and self._playing_reply is not None:
            turn = step.turn
            if turn.summary is not None:
                self.live.add(turn.summary)
            self._playing_reply.finish(turn.summary, turn.settings, turn.error)
            self._playing_reply = None
        if self.finished:
            self.playing = False

    def _show_paused(self) -> None:
        rounds = [s for s in self.steps[: self.position] if s.what == "round"]
        last = rounds[-1].events if rounds else []
        round_event = next((e for e in last if isinstance(e, RoundEvent)), None)
        closing = next(
            (e for e in reversed(last) if isinstance(e, TokenEvent) and e.kind != "accepted"), None
        )
        self.live.set_step(
            StepView(
                on=True,
                paused=True,
                round=shown_round(round_event) if round_event is not None else None,
                closing=shown_token(closing) if closing is not None else None,
            )
        )

    def _update_controls(self) -> None:
        settings = self._turn.settings if self._turn is not None else {}
        self.live.set_controls(
            ControlsView(
                gamma=int(settings.get("gamma") or 0),
                schedule=str(settings.get("schedule") or "–"),
                drafter=str(settings.get("drafter") or "–"),
                temperature=float(settings.get("temperature") or 0.0),
                replay_speed=self.speed,
            )
        )

    def _show_bar(self) -> None:
        rounds = sum(1 for s in self.steps if s.what == "round")
        shown = sum(1 for s in self.steps[: self.position] if s.what == "round")
        state = "finished" if self.finished else ("playing" if self.playing else "paused")
        keys = "Space play/pause · N next round · +/− speed · R restart · Esc close"
        inspect = self.live.display.keys.get("inspect")
        if inspect:
            keys += f" · {display_key(inspect)} inspect"
        bar = Text.assemble(
            (f" replay ×{self.speed:g} ", "reverse bold"),
            f" {state} · round {shown} of {rounds}  ",
            (keys, "dim"),
        )
        self.query_one("#replay-bar", Static).update(bar)
