"""Live panels: α, τ, tokens/s, per-position acceptance, the controls, and the legend.

Every panel is a :class:`LivePanel`: the screen that mounts it calls ``show_live`` with the one
:class:`specchat.ui.state.live.LiveStats` on a timer (never per token), and the panel reads what it
needs and skips the redraw when nothing it shows has changed. Token styles come from the
:class:`~specchat.ui.settings.themes.TokenPalette` the panel was given. :func:`figures` is the one place
the side panel's numbers are formatted: the panel renders it and the tests read it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from rich.style import Style
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Digits, Label, Static

from specchat.engine.backend import FIGURE_LABELS
from specchat.engine.display import REJECTED
from specchat.engine.events import TOKEN_KINDS
from specchat.presenters.bars import bar
from specchat.presenters.kind_labels import KIND_LABELS
from specchat.store.markdown import fmt
from specchat.ui.settings.keys import display_key
from specchat.ui.settings.themes import TokenPalette
from specchat.ui.state.live import ROLLING_WINDOW, ControlsView, LiveStats

SPARK = "▁▂▃▄▅▆▇█"
BAR_WIDTH = 18
MAX_POSITIONS = 8


__all__ = ["ControlsView", "Figures", "LivePanel", "figures"]


@runtime_checkable
class LivePanel(Protocol):
    """A panel the screen refreshes from the live object."""

    def show_live(self, live: LiveStats, force: bool = False) -> None:
        """Redraw from ``live`` if anything shown changed (``force``: redraw anyway)."""
        ...


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
    sources: dict[str, str] = field(default_factory=dict)
    """A server's figures: "alpha" → "measured" | "inferred" | "unavailable" (empty: local)."""
    gamma_control: str = "per-round"
    notes: tuple[str, ...] = ()
    replay_speed: float | None = None


NOT_REPORTED = "not reported by this server"


def figures(live: LiveStats) -> Figures:
    controls = live.controls
    server = controls.server if controls is not None else None
    figs = _local_figures(live)
    if server is None:
        return figs
    figs.sources = {figure: server.source(figure) for figure in FIGURE_LABELS}  # type: ignore[arg-type]
    figs.gamma_control = server.gamma_control
    figs.notes = server.notes
    if figs.sources["alpha"] == "unavailable":
        figs.alpha = figs.alpha_rolling = "–"
        figs.drafted = figs.accepted = "–"
    if figs.sources["tau"] == "unavailable":
        figs.tau = "–"
        figs.reply_rounds = "–"
        figs.last_gamma = "–"
    if figs.sources["per_position"] == "unavailable":
        figs.per_position = []
    # The server chose its drafter and any schedule when it started.
    figs.schedule = figs.drafter = "server's"
    if server.gamma_control in ("fixed", "none"):
        figs.gamma = str(server.gamma) if server.gamma else figs.last_gamma
    return figs


def _local_figures(live: LiveStats) -> Figures:
    controls = live.controls
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
        replay_speed=None if controls is None else controls.replay_speed,
    )


def sparkline(values: Iterable[float], width: int) -> str:
    data = list(values)[-width:]
    if not data:
        return ""
    top = max(data) or 1.0
    return "".join(SPARK[min(len(SPARK) - 1, int(v / top * (len(SPARK) - 1) + 0.5))] for v in data)


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

    def caption_as(self, caption: str) -> None:
        if caption != self.caption:
            self.caption = caption
            self.query_one(Label).update(caption)


class StatsBody(Static):
    """Everything below the big figures, as one rendered table."""

    def __init__(self, palette: TokenPalette, **kwargs: Any) -> None:
        super().__init__("", **kwargs)
        self.palette = palette
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
        styles = self.palette.styles
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

        if f.sources:
            self._render_sources(text, f, bold, dim)
        row("α rolling", f.alpha_rolling, f"last {ROLLING_WINDOW} rounds")
        row("τ", f.tau, "tokens / round" if f.sources.get("tau") != "unavailable" else NOT_REPORTED)
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
            empty = NOT_REPORTED if f.sources.get("per_position") == "unavailable" else "no drafts yet"
            text.append(f"   {empty}\n", dim)
        elif len(f.per_position) > MAX_POSITIONS:
            text.append(f"   +{len(f.per_position) - MAX_POSITIONS} more positions\n", dim)

        header = CONTROL_HEADERS.get(f.gamma_control, "apply next round")
        if f.replay_speed:
            header = f"recorded · replay ×{f.replay_speed:g}"
        text.append(f"\ncontrols · {header}\n", bold)
        gamma = f.gamma if f.schedule in ("fixed", "server's") else f"{f.gamma}→{f.last_gamma}"

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
        for note in f.notes:
            text.append(f"\n{note}", dim)
        text.rstrip()
        return text

    @staticmethod
    def _render_sources(text: Text, f: Figures, bold: Style, dim: Style) -> None:
        """A server's figures, each labelled measured / inferred / not reported."""
        text.append("figures from the server\n", bold)
        words = {"measured": "measured", "inferred": "inferred", "unavailable": "not reported"}
        for source, word in words.items():
            names = [FIGURE_LABELS[name] for name, src in f.sources.items() if src == source]  # type: ignore[index]
            if names:
                text.append(f"{word:<13}", bold)
                text.append(", ".join(names) + "\n", dim if source == "unavailable" else Style())
        text.append("\n")


CONTROL_HEADERS = {
    "per-round": "apply next round",
    "per-request": "apply next reply",
    "fixed": "γ fixed by the server",
    "none": "γ does not apply",
}


def _k(keys: Mapping[str, str], binding_id: str) -> str:
    return display_key(keys.get(binding_id, ""))


class SidePanel(Vertical):
    """α and tokens/s in large digits, then the detailed figures and the controls."""

    def __init__(self, palette: TokenPalette, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.palette = palette
        self._drawn: tuple[int, int] | None = None

    def compose(self) -> ComposeResult:
        with Horizontal(id="big-figures"):
            yield BigFigure("α accepted", id="alpha-figure")
            yield BigFigure("tokens / s", id="rate-figure")
        yield StatsBody(self.palette, id="stats-body")

    def show_live(self, live: LiveStats, force: bool = False) -> None:
        drawn = (live.version, self.palette.version)
        if drawn == self._drawn and not force:
            return
        self._drawn = drawn
        figs = figures(live)
        alpha = self.query_one("#alpha-figure", BigFigure)
        alpha.caption_as(f"α {figs.sources['alpha']}" if figs.sources else "α accepted")
        alpha.show(figs.alpha)
        self.query_one("#rate-figure", BigFigure).show(figs.tokens_per_s)
        self.query_one(StatsBody).show(figs, live.display.keys)

    @property
    def current(self) -> Figures | None:
        return self.query_one(StatsBody).current


class CompactFigures(Static):
    """One line of figures that replaces the side panel in a narrow terminal."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__("", markup=False, **kwargs)
        self._drawn = -1

    def show_live(self, live: LiveStats, force: bool = False) -> None:
        if live.version == self._drawn and not force:
            return
        self._drawn = live.version
        f = figures(live)
        self.update(
            f"α {f.alpha} (rolling {f.alpha_rolling}) · τ {f.tau} · {f.tokens_per_s} tok/s · "
            f"γ {f.gamma} {f.schedule} · drafter {f.drafter} · T {f.temperature}"
        )


class Legend(Static):
    """The four token kinds in their theme styles, and the rejected drafts' look: always visible."""

    def __init__(self, palette: TokenPalette, **kwargs: Any) -> None:
        super().__init__("", **kwargs)
        self.palette = palette
        self.note = ""
        """How a server's colours were obtained ("inferred…", "not reported…"); empty locally."""
        self._drawn: tuple[object, ...] | None = None

    def show_live(self, live: LiveStats, force: bool = False) -> None:
        display = live.display
        drawn = (
            display.markdown,
            display.show_rejected,
            display.note,
            dict(display.keys),
            self.palette.version,
        )
        if drawn == self._drawn and not force:
            return
        self._drawn = drawn
        self.note = display.note
        styles = self.palette.styles
        keys = display.keys
        text = Text()
        for kind in TOKEN_KINDS:
            text.append(f" {KIND_LABELS[kind]} ", styles.get(kind))
            text.append(" ")
        if display.show_rejected:
            text.append(" rejected draft ", styles.get(REJECTED))
        else:
            text.append(" rejected drafts hidden", "dim")
        text.append(f" ({_k(keys, 'rejected')})", "dim")
        text.append(f" · view: {'Markdown' if display.markdown else 'colours'}", "dim")
        if keys.get("view"):
            text.append(f" ({_k(keys, 'view')})", "dim")
        if display.note:
            text.append(f" · {display.note}", "dim")
        self.update(text)
