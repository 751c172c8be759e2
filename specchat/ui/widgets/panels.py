"""Live panels: α, τ, tokens/s, per-position acceptance, the controls, and the legend.

Panels are redrawn by the app on a timer from :class:`specchat.ui.live.LiveStats`, never
per token. :func:`figures` is the one place numbers are formatted: the panel renders it and
the tests read it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from rich.style import Style
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Digits, Label, Static

from specchat.engine.events import TOKEN_KINDS
from specchat.ui.keys import display_key
from specchat.ui.live import ROLLING_WINDOW, LiveStats
from specchat.ui.store import fmt
from specchat.ui.themes import KIND_LABELS
from specchat.ui.widgets.transcript import styles_of

SPARK = "▁▂▃▄▅▆▇█"
BAR_WIDTH = 18
MAX_POSITIONS = 8


@dataclass(frozen=True)
class ControlsView:
    """The controls as the panel shows them (copied from the engine's Controls)."""

    gamma: int
    schedule: str
    drafter: str
    temperature: float
    drafters: tuple[str, ...] = ()


@dataclass
class Figures:
    alpha: str
    alpha_rolling: str
    tau: str
    tokens_per_s: str
    drafted: str
    accepted: str
    reply_tokens: str
    reply_rounds: str
    gamma: str
    schedule: str
    drafter: str
    temperature: str
    last_gamma: str
    per_position: list[tuple[int, float | None]] = field(default_factory=list)
    rates: list[float] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def figures(live: LiveStats, controls: ControlsView | None) -> Figures:
    conv = live.conversation
    rate = live.tokens_per_s
    last = live.last_round
    return Figures(
        alpha=fmt(conv.alpha),
        alpha_rolling=fmt(live.rolling.value),
        tau=fmt(conv.tau),
        tokens_per_s="–" if rate is None else f"{rate:.1f}",
        drafted=str(conv.drafted),
        accepted=str(conv.accepted),
        reply_tokens=str(live.reply.tokens),
        reply_rounds=str(live.reply.rounds),
        gamma="–" if controls is None else str(controls.gamma),
        schedule="–" if controls is None else controls.schedule,
        drafter="–" if controls is None else controls.drafter,
        temperature="–" if controls is None else f"{controls.temperature:.1f}",
        last_gamma="–" if last is None else str(last.gamma),
        per_position=list(enumerate(conv.per_position, start=1)),
        rates=list(live.rates),
    )


def sparkline(values: Iterable[float], width: int) -> str:
    data = list(values)[-width:]
    if not data:
        return ""
    top = max(data) or 1.0
    return "".join(SPARK[min(len(SPARK) - 1, int(v / top * (len(SPARK) - 1) + 0.5))] for v in data)


def bar(value: float, width: int) -> str:
    eighths = round(max(0.0, min(1.0, value)) * width * 8)
    full, part = divmod(eighths, 8)
    partial = " ▏▎▍▌▋▊▉"[part] if part else ""
    return "█" * full + partial


class BigFigure(Vertical):
    """A large number with a caption, readable from the back of a room."""

    DEFAULT_CSS = """
    BigFigure { height: auto; width: 1fr; }
    BigFigure > Label { width: 1fr; }
    """

    def __init__(self, caption: str, *, id: str) -> None:
        super().__init__(id=id)
        self.caption = caption
        self.digits = Digits("–")

    def compose(self) -> ComposeResult:
        yield Label(self.caption, classes="caption")
        yield self.digits

    def show(self, value: str) -> None:
        if self.digits.value != value:
            self.digits.update(value)


class StatsBody(Static):
    """Everything below the big figures, as one rendered table."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__("", **kwargs)
        self.current: Figures | None = None
        self._lines = -1

    def show(self, figs: Figures, keys: Mapping[str, str]) -> None:
        self.current = figs
        text = self._render_figures(figs, keys)
        lines = text.plain.count("\n")
        # Reflow the screen only when the number of lines changes (a new draft position).
        self.update(text, layout=lines != self._lines)
        self._lines = lines

    def _render_figures(self, f: Figures, keys: Mapping[str, str]) -> Text:
        # Plain Text lines, not Rich tables: this redraws several times a second while a
        # reply streams, and must stay cheap (the UI thread shares the GIL with decoding).
        styles = styles_of(self)
        bold = Style(bold=True)
        dim = Style(dim=True)
        # Bars take the accepted colour only (a theme's token background would fill the track).
        accepted_style = Style(color=styles["accepted"].color) if "accepted" in styles else Style()
        text = Text(end="")

        def row(label: str, value: str, note: str | Text = "", width: int = 10, value_width: int = 6) -> None:
            text.append(label.ljust(width), bold)
            text.append(value.rjust(value_width) + "  ")
            text.append(note if isinstance(note, Text) else Text(note, dim))
            text.append("\n")

        row("α rolling", f.alpha_rolling, f"last {ROLLING_WINDOW} rounds")
        row("τ", f.tau, "tokens / round")
        row("drafted", f.drafted, Text.assemble("accepted ", (f.accepted, "bold")))
        row("reply", f.reply_tokens, f"tokens in {f.reply_rounds} rounds")
        text.append("tok/s ", bold)
        text.append(sparkline(f.rates, 28), accepted_style)
        text.append("\n\nacceptance by draft position\n", bold)
        shown = f.per_position[:MAX_POSITIONS]
        for index, rate in shown:
            filled = bar(rate or 0.0, BAR_WIDTH)
            text.append(f"{index:>2} ")
            text.append(filled, accepted_style)
            text.append("░" * (BAR_WIDTH - len(filled)), dim)
            text.append(f" {fmt(rate)}\n")
        if not shown:
            text.append("   no drafts yet\n", dim)
        elif len(f.per_position) > MAX_POSITIONS:
            text.append(f"   +{len(f.per_position) - MAX_POSITIONS} more positions\n", dim)

        text.append("\ncontrols · apply next round\n", bold)
        gamma = f.gamma if f.schedule == "fixed" else f"{f.gamma}→{f.last_gamma}"

        def control(label: str, value: str, key: str) -> None:
            text.append(label.ljust(13), bold)
            text.append(value.ljust(11))
            text.append(key, dim)
            text.append("\n")

        control("γ", gamma, f"{_k(keys, 'gamma_down')} {_k(keys, 'gamma_up')}")
        control("schedule", f.schedule, _k(keys, "schedule"))
        control("drafter", f.drafter, _k(keys, "drafter"))
        control("temperature", f.temperature, f"{_k(keys, 'temperature_down')} {_k(keys, 'temperature_up')}")
        control("last round γ", f.last_gamma, "")
        text.rstrip()
        return text


def _k(keys: Mapping[str, str], binding_id: str) -> str:
    return display_key(keys.get(binding_id, ""))


class SidePanel(Vertical):
    """α and tokens/s in large digits, then the detailed figures and the controls."""

    def compose(self) -> ComposeResult:
        with Horizontal(id="big-figures"):
            yield BigFigure("α accepted", id="alpha-figure")
            yield BigFigure("tokens / s", id="rate-figure")
        yield StatsBody(id="stats-body")

    def show(self, figs: Figures, keys: Mapping[str, str]) -> None:
        self.query_one("#alpha-figure", BigFigure).show(figs.alpha)
        self.query_one("#rate-figure", BigFigure).show(figs.tokens_per_s)
        self.query_one(StatsBody).show(figs, keys)

    @property
    def current(self) -> Figures | None:
        return self.query_one(StatsBody).current


class Legend(Static):
    """The four token kinds in their theme styles, always visible."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__("", **kwargs)
        self.view = "provenance"
        self.view_key = ""

    def on_mount(self) -> None:
        self.redraw()

    def redraw(self) -> None:
        styles = styles_of(self)
        text = Text()
        for kind in TOKEN_KINDS:
            text.append(f" {KIND_LABELS[kind]} ", styles.get(kind))
            text.append(" ")
        text.append(f" view: {self.view}", "dim")
        if self.view_key:
            text.append(f" ({self.view_key})", "dim")
        self.update(text)
