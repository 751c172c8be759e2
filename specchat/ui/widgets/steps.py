"""The step table: while step mode holds decoding between rounds, the round just run.

One row per drafted token (position, the draft token, q = p_draft, p = p_target,
min(1, p/q), the uniform draw u, the verdict), then the round's closing token and the
distribution it was drawn from. The screen mounts it; it shows itself only while paused.
"""

from __future__ import annotations

from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text
from textual.widgets import Static

from specchat.engine.display import REJECTED
from specchat.presenters.kind_labels import KIND_LABELS
from specchat.ui.settings.keys import display_key
from specchat.ui.settings.themes import TokenPalette
from specchat.ui.state.live import LiveStats, StepView
from specchat.ui.widgets.inspector import prob, shown

VERDICT_STYLES = {"accepted": "bold", "rejected": "bold red", "untested": "dim"}


class StepPanel(Static):
    """The paused round as a table (see the module's docstring)."""

    def __init__(self, palette: TokenPalette, **kwargs: Any) -> None:
        super().__init__("", **kwargs)
        self.border_title = "step mode"
        self.palette = palette
        self._drawn: tuple[object, ...] | None = None

    def show_live(self, live: LiveStats, force: bool = False) -> None:
        step = live.step
        self.display = step.on and step.paused
        drawn = (step, live.controls, dict(live.display.keys), self.palette.version)
        if (drawn == self._drawn and not force) or not self.display:
            self._drawn = drawn
            return
        self._drawn = drawn
        self.update(self.describe(step, live))

    def describe(self, step: StepView, live: LiveStats) -> RenderableType:
        keys = live.display.keys
        next_key = display_key(keys.get("step", ""))
        mode_key = display_key(keys.get("step_mode", ""))
        controls = live.controls
        replaying = controls is not None and controls.replay_speed is not None
        again = "plays on" if replaying else "streams again"
        hint = Text(f"paused · {next_key} runs the next round · {mode_key} {again}", "dim")
        upcoming = (
            f"next round: γ {controls.gamma} · {controls.drafter} · T {controls.temperature:.1f}"
            if controls is not None and not replaying
            else ""
        )
        round_event = step.round
        if round_event is None:
            return Group(Text("no round run yet", "bold"), hint, Text(upcoming, "dim"))
        title = Text(
            f"round {round_event.round + 1} · γ {round_event.gamma} · drafter {round_event.drafter} · "
            f"{round_event.accepted} of {round_event.drafted} drafts accepted"
            + (" · reasoning" if step.closing is not None and step.closing.reasoning else ""),
            "bold",
        )
        table = Table(box=None, padding=(0, 1), show_edge=False, header_style="bold")
        for column, justify in (
            ("pos", "right"),
            ("draft", "left"),
            ("q", "right"),
            ("p", "right"),
            ("min(1, p/q)", "right"),
            ("u", "right"),
            ("verdict", "left"),
        ):
            table.add_column(column, justify=justify, no_wrap=True)  # type: ignore[arg-type]
        styles = self.palette.styles
        for position, draft in enumerate(round_event.drafts, start=1):
            kind = "accepted" if draft.verdict == "accepted" else REJECTED
            table.add_row(
                str(position),
                Text(shown(draft.text), styles.get(kind) or ""),
                prob(draft.p_draft),
                prob(draft.p_target),
                prob(draft.accept_prob),
                "–" if draft.u is None else f"{draft.u:.3f}",
                Text(draft.verdict, VERDICT_STYLES[draft.verdict]),
            )
        if round_event.drafted and not round_event.drafts:
            table.add_row("", Text("no trace recorded for this round", "dim"), "", "", "", "", "")
        closing = step.closing
        if closing is not None:
            source = {"residual": "· residual", "target": "· target's p"}.get(closing.drawn_from, "")
            table.add_row(
                str(closing.position + 1),
                Text(shown(closing.text), styles.get(closing.kind) or ""),
                "",
                prob(closing.p_target),
                "",
                "",
                Text(f"{KIND_LABELS[closing.kind]} {source}", styles.get(closing.kind) or ""),
            )
        greedy = any(d.u is None and d.verdict != "untested" for d in round_event.drafts)
        rule = "at T = 0 a draft passes if it is p's top token" if greedy else "passes if u < min(1, p/q)"
        legend = Text(f"q = p_draft, p = p_target; {rule}", "dim")
        return Group(title, table, legend, hint, Text(upcoming, "dim"))
