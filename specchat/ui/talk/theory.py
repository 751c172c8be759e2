"""The theory panel: the seed formulas with this session's numbers, and the γ advisor's plot.

Self-contained: it reads the app's :class:`~specchat.ui.talk.theory_tracker.TheoryTracker` and controls on
its own timer (never per token), runs the plain probe itself when no plain rate was measured,
and is mounted on (and removed from) whatever screen shows the chat.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.widgets import Static
from textual_plotext import PlotextPlot

from specchat.engine.events import Event
from specchat.engine.registry import plain_drafter
from specchat.ui.state.lease import JobEnded, ModelLease, run_job
from specchat.ui.talk.theory_tracker import (
    ADVISOR_GAMMAS,
    COST_GAMMAS,
    PROBE_PROMPT,
    PROBE_TOKENS,
    TheoryView,
    schedule_line,
    theory_lines,
)

if TYPE_CHECKING:
    from specchat.engine.backend import Backend, Controls
    from specchat.ui.talk.theory_tracker import TheoryTracker

REFRESH_S = 0.5


class AdvisorPlot(PlotextPlot):
    """Predicted speed-up against γ, with the current and the best γ marked."""

    def show(self, view: TheoryView) -> None:
        plt = self.plt
        plt.clear_data()
        plt.clear_figure()
        gammas = list(ADVISOR_GAMMAS)
        plt.xticks([float(g) for g in (gammas[::3] if self.size.width < 50 else gammas)])
        plt.xlabel("γ")
        if not view.curve:
            plt.title("speed-up: needs α, c, v(γ)")
            self.refresh()
            return
        ys = [view.curve[g] for g in gammas]
        # No plotext legend: its box would hide the curve's top-left, where small γ often wins.
        # Past the widest verify pass timed the curve is a forecast: drawn as dots, not a line.
        widest = view.extrapolated_past
        measured = [g for g in gammas if widest is None or g <= widest]
        plt.plot(measured, [view.curve[g] for g in measured], marker="braille", color="cyan")
        if widest is not None:
            beyond = [g for g in gammas if g > widest]
            plt.scatter(beyond, [view.curve[g] for g in beyond], marker="·", color="cyan")
        plt.hline(1.0, color="gray")
        if view.gamma in view.curve:
            plt.scatter([view.gamma], [view.curve[view.gamma]], marker="●", color="orange")
        if view.best_gamma is not None:
            plt.scatter([view.best_gamma], [view.curve[view.best_gamma]], marker="★", color="green")
        plt.ylim(min(0.0, *ys), max(1.1, *ys) * 1.1)
        # plotext drops a title wider than the plot: short, the rest is in the panel's text.
        plt.title(f"speed-up · ● γ {view.gamma} · ★ best {view.best_gamma}")
        self.refresh()


class CostPlot(PlotextPlot):
    """The premise against this machine: what a verify pass of γ+1 positions costs, in plain
    steps, beside the seed's "costs about the same" (v = 1) and the most it may cost for drafting
    γ to pay (E[T] − γ·c). Where the measured cost stays under that line, speculation pays."""

    def show(self, view: TheoryView) -> None:
        plt = self.plt
        plt.clear_data()
        plt.clear_figure()
        gammas = list(COST_GAMMAS)
        plt.xticks([float(g) for g in (gammas[::2] if self.size.width < 36 else gammas)])
        plt.xlabel("γ")
        plt.hline(1.0, color="gray")  # the seed's premise
        if not view.v_curve:
            plt.title("cost v(γ): needs timed rounds")
            plt.ylim(0.0, 2.0)
            self.refresh()
            return
        measured = [g for g in gammas if g in view.measured_widths]
        widest = max(measured, default=0)
        within = [g for g in gammas if g <= widest]
        if within:
            plt.plot(within, [view.v_curve[g] for g in within], marker="braille", color="orange")
        beyond = [g for g in gammas if g > widest]
        plt.scatter(beyond, [view.v_curve[g] for g in beyond], marker="·", color="orange")
        plt.scatter(measured, [view.v_curve[g] for g in measured], marker="●", color="orange")
        ys = [*view.v_curve.values(), 1.0]
        if view.break_even:
            # Below zero nothing could pay: the line stops at the axis rather than stretch it.
            pays_below = [max(view.break_even[g], 0.0) for g in gammas]
            plt.plot(gammas, pays_below, marker="braille", color="green")
            ys += pays_below
        plt.ylim(0.0, max(2.0, *ys) * 1.1)
        plt.title("cost of a pass v(γ), in steps")
        self.refresh()


class TheoryPanel(Horizontal):
    """Docked under the chat; toggled by the theory key."""

    DEFAULT_CSS = """
    TheoryPanel {
        dock: bottom;
        height: 18;
        margin-bottom: 1;  /* above the footer, which docks at the bottom too */
        background: $surface;
        border-top: solid $primary;
    }
    TheoryPanel #theory-text {
        width: 2fr;
        padding: 0 1;
    }
    TheoryPanel AdvisorPlot, TheoryPanel CostPlot {
        width: 1fr;
        min-width: 28;
    }
    """

    def __init__(self, tracker: TheoryTracker, lease: ModelLease, apply_key: str = "") -> None:
        """``lease`` gives the controls in force and runs the plain probe on the models."""
        super().__init__(id="theory")
        self.tracker = tracker
        self.lease = lease
        self.probe_events: list[Event] = []
        """Written by the probe's worker thread, read when its JobEnded arrives."""
        self.apply_key = apply_key
        self.probe_error: str | None = None
        self.probing = False
        self._shown: object = None

    def compose(self) -> ComposeResult:
        yield Static(id="theory-text", markup=False)
        yield CostPlot(id="costs")
        yield AdvisorPlot(id="advisor")

    def on_mount(self) -> None:
        self.border_title = "theory against measurement"
        self.set_interval(REFRESH_S, self.update_figures)
        self.update_figures(force=True)

    @property
    def view(self) -> TheoryView | None:
        controls = self.lease.controls
        if controls is None:
            return None
        return self.tracker.view(controls.gamma, controls.drafter)

    def update_figures(self, force: bool = False) -> None:
        self.tracker.poll()
        self._maybe_probe()
        view = self.view
        controls = self.lease.controls
        key = (
            self.tracker.version,
            view,
            self.probing,
            self.probe_error,
            getattr(controls, "schedule", None),
        )
        if not force and key == self._shown:
            return
        self._shown = key
        text = self.query_one("#theory-text", Static)
        if view is None:
            text.update("The models are still loading.")
            return
        lines = theory_lines(view, self.apply_key)
        if self.probing:
            lines.append(f"running a plain probe ({PROBE_TOKENS} tokens, drafter none) for the plain rate…")
        elif self.probe_error:
            lines.append(f"plain probe failed: {self.probe_error}")
        if controls is not None and controls.schedule != "fixed":
            # The schedule's own reason for its latest γ: where it turned drafting off, it says why.
            lines.append(schedule_line(controls.schedule, controls.gamma, view.schedule_note))
        text.update("\n".join(lines))
        self.query_one(CostPlot).show(view)
        self.query_one(AdvisorPlot).show(view)

    # ------------------------------------------------------------------ the plain probe

    def _maybe_probe(self) -> None:
        if self.probing or self.probe_error or not self.tracker.needs_probe:
            return
        controls = self.lease.controls
        backend = self.lease.backend
        if backend is None or controls is None or self.lease.local is None:
            return
        plain = replace(controls, drafter=plain_drafter(), schedule="fixed", max_new_tokens=PROBE_TOKENS)
        # False while a reply or a race uses the models: the next tick tries again.
        self.probing = run_job(
            self, self.lease, "the plain probe", self._probe_job(backend, plain), name="plain probe"
        )

    def _probe_job(self, backend: Backend, controls: Controls) -> Callable[[threading.Event], None]:
        """A short reply with drafting off, in the worker thread: the plain decoding rate."""

        def job(cancel: threading.Event) -> None:
            self.probe_events = []
            for event in backend.stream_chat([{"role": "user", "content": PROBE_PROMPT}], controls, cancel):
                self.probe_events.append(event)

        return job

    def on_job_ended(self, message: JobEnded) -> None:
        self.probing = False
        self.probe_error = message.error
        self.tracker.observe_probe(self.probe_events)
        self.update_figures(force=True)
