"""Theory against measurement: the seed formulas filled in with what this session measured.

:class:`TheoryTracker` follows the live statistics (rounds and reply summaries, polled on a
timer) and keeps what the formulas need: α per tested draft position for the drafter in use,
c and v(γ) from rounds' own timings (:class:`~specchat.engine.metrics.CostEstimator`), the
latest speculative reply's tokens/s, and a plain-decoding rate from a reply that drafted nothing
(the plain probe, when nothing else measured one). :meth:`TheoryTracker.view` computes every
figure the panel shows with :mod:`specchat.engine.metrics`, the one place the formulas live.

"This session" is literal: rounds of a conversation reopened from disk were timed by another
process and are skipped. Pure Python: no textual, no torch.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from specchat.engine.costs import CostEstimator, CostModel, expected_tokens_per_round
from specchat.engine.events import Event, RoundEvent, SummaryEvent, known
from specchat.engine.gamma import GAMMA_CHANGE
from specchat.engine.metrics import acceptance_per_position, positions_tested
from specchat.engine.registry import find_drafter
from specchat.params import GAMMA_MAX
from specchat.ui.state.live import LiveStats
from specchat.untrusted import clipped, visible

ALPHA_ROUNDS = 48
"""Drafted rounds α is measured over: recent enough to move with the text, long enough to settle."""
ADVISOR_GAMMAS = tuple(range(1, GAMMA_MAX + 1))
COST_GAMMAS = tuple(range(1, 9))
"""γ shown on the cost plot: verify passes of 2 to 9 positions, the widths the kernels are timed at."""
NOTE_LIMIT = 240
"""Characters of the schedule's note the panel shows."""
PREMISE_SLACK = 0.1
"""How far above one step a verify pass may cost and still "cost about the same" (v ≤ 1.1)."""
PROBE_TOKENS = 32
"""Tokens the plain probe decodes (a few seconds on the packaged pair)."""
PROBE_PROMPT = "Write a Python function that checks whether a number is prime."


@dataclass(frozen=True)
class TheoryView:
    """Every figure of the panel, computed from one tracker state (None: not measured yet)."""

    drafter: str | None
    """Whose rounds the figures describe (a drafter that proposes itself, never a combined one)."""
    gamma: int
    alpha: float | None
    alpha_positions: int
    expected_tokens: float | None
    plain_ms: float | None
    draft_ms: float | None
    verify_ms: float | None
    c: float | None
    v: float | None
    v_measured: bool
    measured_widths: tuple[int, ...]
    predicted: float | None
    curve: dict[int, float] = field(default_factory=dict)
    """Predicted speed-up by γ: one computation per γ, read by the text, the plot and the key."""
    best_gamma: int | None = None
    speculative_rate: float | None = None
    plain_rate: float | None = None
    plain_source: str = ""
    v_curve: dict[int, float] = field(default_factory=dict)
    """v(γ) for the cost plot (COST_GAMMAS): measured where timed, the cost line elsewhere."""
    break_even: dict[int, float] = field(default_factory=dict)
    """E[T](α, γ) − γ·c: the most a verify pass may cost, in plain steps, for drafting γ to pay."""
    schedule_note: str = ""
    """The γ schedule's reason for the latest round's γ (RoundEvent.note; adaptive only)."""
    part_of: str | None = None
    """The combined drafter (the hybrid) whose part ``drafter`` is, the part that drafted last;
    None when the figures are the set drafter's own. The panel then names the part, since the
    schedule's note may speak of the other one (each part has its own α and c)."""

    @property
    def premise_holds_to(self) -> int | None:
        """The widest measured γ up to which every measured pass cost about one step (v ≤ 1.1):
        where the seed's premise holds on this machine (0: not even at γ 1; None: none timed)."""
        measured = [g for g in self.measured_widths if g in self.v_curve]
        if not measured:
            return None
        holds = 0
        for g in sorted(measured):
            if self.v_curve[g] > 1.0 + PREMISE_SLACK:
                break
            holds = g
        return holds

    @property
    def pays(self) -> bool | None:
        """Whether any γ is predicted to beat plain decoding (None: not predictable yet)."""
        return None if not self.curve else max(self.curve.values()) > 1.0

    @property
    def extrapolated_past(self) -> int | None:
        """The widest γ whose verify pass was timed, when the curve goes beyond it: past it the
        curve's v(γ) is the cost line's extrapolation, not a measurement (None otherwise)."""
        if not self.curve or not self.measured_widths:
            return None
        widest = max(self.measured_widths)
        return widest if max(self.curve) > widest else None

    @property
    def measured_speedup(self) -> float | None:
        if self.speculative_rate is None or not self.plain_rate:
            return None
        return self.speculative_rate / self.plain_rate

    @property
    def agreement(self) -> float | None:
        """Measured over predicted speed-up (1.0: the formula predicted the measurement)."""
        measured = self.measured_speedup
        if measured is None or not self.predicted:
            return None
        return measured / self.predicted


class TheoryTracker:
    """What this session measured, for the seed formulas and the γ advisor."""

    def __init__(self, live: LiveStats) -> None:
        self.live = live
        self.costs = CostEstimator()
        self.drafted_rounds: dict[str, deque[RoundEvent]] = {}
        self.last_drafter: str | None = None
        self.speculative_rate: float | None = None
        self.plain_rate: float | None = None
        self.plain_source = ""
        self.schedule_note = ""
        self.version = 0
        # What the live statistics hold when the tracker starts was measured by this process
        # (the app makes its tracker before anything streams); only later swaps can bring
        # rounds from disk.
        self._stats = live.conversation
        self._rounds_seen = 0
        self._summaries_seen: deque[SummaryEvent] = deque(maxlen=64)

    # ------------------------------------------------------------------ following the chat

    def poll(self) -> bool:
        """Take what the chat measured since the last poll; True when anything changed."""
        before = self.version
        if self.live.conversation is not self._stats:
            # Cleared, reopened or rebuilt (regenerate): what it holds now was either counted
            # already or timed by another process.
            self._stats = self.live.conversation
            self._rounds_seen = len(self._stats.round_events)
            if self.live.reply_summary is not None:
                self._summaries_seen.append(self.live.reply_summary)
            self.version += 1
        rounds = self._stats.round_events
        for event in rounds[self._rounds_seen :]:
            self.observe_round(event)
        self._rounds_seen = len(rounds)
        summary = self.live.reply_summary
        if summary is not None and not any(s is summary for s in self._summaries_seen):
            self._summaries_seen.append(summary)
            self.observe_reply(self.live.reply.round_events, summary, "last plain reply")
        return self.version != before

    def observe_round(self, event: RoundEvent) -> None:
        self.costs.observe(event)
        self.schedule_note = clipped(visible(event.note), NOTE_LIMIT)  # a saved file could hold anything
        if event.drafted:
            self.drafted_rounds.setdefault(event.drafter, deque(maxlen=ALPHA_ROUNDS)).append(event)
            self.last_drafter = event.drafter
        self.version += 1

    def observe_reply(self, rounds: Iterable[RoundEvent], summary: SummaryEvent, plain_source: str) -> None:
        """A finished reply: a plain rate if it drafted nothing, else the speculative rate."""
        if summary.tokens < 2 or summary.stop == "cancelled" or summary.tokens_per_s <= 0:
            return
        if not known(summary.tokens_per_s):
            return
        if any(r.drafted for r in rounds):
            self.speculative_rate = summary.tokens_per_s
        else:
            self.plain_rate = summary.tokens_per_s
            self.plain_source = plain_source
        self.version += 1

    def observe_probe(self, events: Iterable[Event]) -> None:
        """The plain probe's events: its rounds time V(0), its summary is the plain rate."""
        rounds: list[RoundEvent] = []
        for event in events:
            if isinstance(event, RoundEvent):
                rounds.append(event)
                self.costs.observe(event)
            elif isinstance(event, SummaryEvent):
                self.observe_reply(rounds, event, f"plain probe, {event.tokens} tokens")
        self.version += 1

    @property
    def needs_probe(self) -> bool:
        return self.plain_rate is None

    # ------------------------------------------------------------------ the figures

    def alpha(self, drafter: str) -> tuple[float | None, int]:
        """α per tested draft position over the drafter's recent rounds, and how many positions."""
        rounds = self.drafted_rounds.get(drafter, ())
        return acceptance_per_position(rounds), sum(positions_tested(r) for r in rounds)

    def model(self, drafter: str | None) -> CostModel | None:
        return self.costs.model(drafter) if drafter is not None else None

    def drafter_for(self, drafter_setting: str) -> str | None:
        """Whose figures to show: the set drafter, or for a combined one (the hybrid) the part
        that drafted last; None for no drafter. A name the registry does not know (a server's
        drafter) stamps its own rounds, so its figures are its own."""
        spec = find_drafter(drafter_setting)
        if spec is None:
            return drafter_setting
        return spec.figures_of(self.last_drafter)

    def view(self, gamma: int, drafter_setting: str) -> TheoryView:
        drafter = self.drafter_for(drafter_setting)
        alpha, positions = self.alpha(drafter) if drafter is not None else (None, 0)
        model = self.model(drafter)
        expected = expected_tokens_per_round(alpha, gamma) if alpha is not None else None
        curve: dict[int, float] = {}
        v_curve: dict[int, float] = {}
        break_even: dict[int, float] = {}
        best = predicted = None
        c = v = verify = None
        if model is not None:
            c, v, verify = model.c, model.v(gamma), model.verify(gamma)
            v_curve = {g: model.v(g) for g in COST_GAMMAS}
            if alpha is not None:
                predicted = model.speedup(alpha, gamma)
                curve = model.curve(alpha, ADVISOR_GAMMAS)
                best = best_of(curve)
                break_even = {g: expected_tokens_per_round(alpha, g) - g * model.c for g in COST_GAMMAS}
        return TheoryView(
            drafter=drafter,
            gamma=gamma,
            alpha=alpha,
            alpha_positions=positions,
            expected_tokens=expected,
            plain_ms=self.costs.plain_ms,
            draft_ms=self.costs.draft_ms(drafter) if drafter is not None else None,
            verify_ms=verify,
            c=c,
            v=v,
            v_measured=model is not None and model.is_measured(gamma),
            measured_widths=tuple(sorted(model.verify_ms)) if model is not None else (),
            predicted=predicted,
            curve=curve,
            best_gamma=best,
            speculative_rate=self.speculative_rate,
            plain_rate=self.plain_rate,
            plain_source=self.plain_source,
            v_curve=v_curve,
            break_even=break_even,
            schedule_note=self.schedule_note,
            part_of=drafter_setting if drafter not in (None, drafter_setting) else None,
        )


def best_of(curve: dict[int, float]) -> int:
    """The γ with the highest predicted speed-up (the smallest on a tie), from the curve as
    computed, so the advisor's choice and the plotted curve cannot disagree."""
    return max(curve, key=lambda g: (curve[g], -g))


# ---------------------------------------------------------------------------------- wording


def _num(value: float | None, digits: int = 2) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def theory_lines(view: TheoryView, apply_key: str = "") -> list[str]:
    """The panel's text: each formula, then the same formula with this session's numbers."""
    g = view.gamma
    lines: list[str] = []
    if view.drafter is None:
        return ["The drafter is none: nothing is drafted, so there is no speed-up to predict."]
    if view.alpha is None:
        lines.append(f"α: no {view.drafter} drafts verified yet in this session (send a message)")
    else:
        whose = f" of {view.drafter}, the part of {view.part_of} that drafted last" if view.part_of else ""
        lines.append(
            f"α = {view.alpha:.3f} per tested draft position "
            f"({view.alpha_positions} in the last {ALPHA_ROUNDS} drafted rounds{whose})"
        )
    if view.alpha is not None and view.expected_tokens is not None:
        lines.append(
            f"E[T] = (1 − α^(γ+1)) / (1 − α) = (1 − {view.alpha:.3f}^{g + 1}) / (1 − {view.alpha:.3f}) "
            f"= {view.expected_tokens:.2f}"
        )
    else:
        lines.append("E[T] = (1 − α^(γ+1)) / (1 − α): needs α")
    if view.c is None or view.plain_ms is None or view.draft_ms is None:
        lines.append("c = d / V(0): needs a plain step and a drafted round timed in this session")
    else:
        whose = f"{view.drafter}: " if view.part_of else ""
        lines.append(
            f"c = d / V(0) = {view.draft_ms:.2f} ms / {view.plain_ms:.2f} ms = {view.c:.3f}"
            f"  ({whose}a draft / a step)"
        )
    if view.v is not None and view.verify_ms is not None and view.plain_ms is not None:
        how = (
            "measured"
            if view.v_measured
            else (
                "on the line through γ " + ", ".join(str(w) for w in view.measured_widths)
                if view.measured_widths
                else "no verify pass measured yet: assumed flat"
            )
        )
        lines.append(
            f"v(γ) = V(γ) / V(0) = {view.verify_ms:.2f} ms / {view.plain_ms:.2f} ms = {view.v:.3f}  ({how})"
        )
    else:
        lines.append("v(γ) = V(γ) / V(0): needs timed rounds")
    if view.predicted is not None and view.expected_tokens is not None and view.c is not None:
        lines.append(
            f"predicted = E[T] / (γ·c + v(γ)) = {view.expected_tokens:.2f} / ({g} × {view.c:.3f} + "
            f"{_num(view.v, 3)}) = {view.predicted:.2f}×"
        )
    else:
        lines.append("predicted = E[T] / (γ·c + v(γ)): needs α, c and v(γ)")
    measured = view.measured_speedup
    if measured is not None:
        lines.append(
            f"measured = {view.speculative_rate:.1f} tok/s / {view.plain_rate:.1f} tok/s = {measured:.2f}×"
            f"  (last reply / {view.plain_source})"
        )
    elif view.plain_rate is None:
        lines.append("measured: needs a plain-decoding rate (the plain probe runs when the models are idle)")
    else:
        lines.append(f"measured: plain {view.plain_rate:.1f} tok/s; needs a finished speculative reply")
    if view.agreement is not None:
        lines.append(f"measured / predicted = {view.agreement:.2f}")
    premise = premise_line(view)
    if premise:
        lines.append(premise)
    if view.best_gamma is not None and view.pays is False:
        lines.append(why_no_gamma_pays(view))
    elif view.best_gamma is not None:
        best = view.curve[view.best_gamma]
        here = view.curve.get(g)
        tail = f" · {apply_key} applies it" if apply_key and view.best_gamma != g else ""
        lines.append(f"γ advisor: best γ {view.best_gamma} predicts {best:.2f}× (γ {g}: {_num(here)}×){tail}")
    if view.extrapolated_past is not None:
        lines.append(extrapolation_note(view.extrapolated_past))
    return lines


def schedule_line(schedule: str, gamma: int, note: str) -> str:
    """The schedule's own reason for its latest γ (a schedule other than fixed), labelled: its
    figures are its own estimates, judged before that round ran, with α weighted to recent
    positions (the formulas above count the last rounds evenly); c and v(γ) are the same
    CostEstimator's over the same rounds. Without a note, what the user's γ means to it."""
    if note:
        return f"schedule {schedule} (its own α, weighted to recent positions): {note}"
    change = GAMMA_CHANGE.get(schedule, "it picks γ per round")
    return f"schedule {schedule}: γ {gamma} is where it starts; {change}"


def premise_line(view: TheoryView) -> str:
    """The cost plot in words: this machine's v(γ) against the seed's premise that a verify pass
    costs about one step, and against what a pass may cost for drafting γ to pay."""
    holds = view.premise_holds_to
    if holds is None:
        return ""
    timed = sorted(g for g in view.measured_widths if g in view.v_curve)
    if holds >= timed[-1]:
        verdict = f"holds to γ {timed[-1]}, the widest timed"
    else:
        fails = min(g for g in timed if g > holds)
        where = f"holds to γ {holds}" if holds else "fails at γ 1"
        verdict = f"{where}: v({fails}) = {view.v_curve[fails]:.2f}"
    pays = "; green E[T] − γ·c: γ pays where orange is below it" if view.break_even else ""
    return f"cost plot: orange v(γ) here, gray the premise v ≈ 1 ({verdict}){pays}"


def why_no_gamma_pays(view: TheoryView) -> str:
    """The advisor when no γ beats plain decoding: what the best γ costs against what it earns."""
    assert view.best_gamma is not None and view.alpha is not None
    best = view.best_gamma
    earned = expected_tokens_per_round(view.alpha, best)
    cost = earned / view.curve[best]  # γ·c + v(γ), as the curve's speed-up was computed
    return (
        f"γ advisor: no γ pays here: at best γ {best}, {best}·c + v = {cost:.2f} steps buy "
        f"E[T] = {earned:.2f} tokens ({view.curve[best]:.2f}×); the adaptive schedule decodes plainly, "
        "probing now and then"
    )


def extrapolation_note(widest: int) -> str:
    """Where the advisor's curve stops being measured, so a falling tail is read as a forecast."""
    return f"past γ {widest} (dotted): no wider verify pass timed yet, v(γ) is extrapolated"
