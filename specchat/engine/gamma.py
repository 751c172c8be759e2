"""γ schedules: how many tokens to draft next round.

The engine asks a schedule once per round (``next_gamma``) and reports each finished round
(``observe``), so a key press changing γ between rounds never races the loop. A schedule may
answer 0: the round then drafts nothing and is one plain target step.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol

from specchat.engine.events import DrafterName, RoundEvent, known
from specchat.engine.metrics import (
    ROUTINE_CATCH_UP,
    CostEstimator,
    expected_tokens_per_round,
    positions_tested,
)
from specchat.engine.registry import is_model, proposes
from specchat.errors import InvalidSettingError
from specchat.params import DRAFT_STOP_BELOW, GAMMA_MAX

__all__ = [
    "GAMMA_CHANGE",
    "GAMMA_USE",
    "NO_OUTLOOK",
    "SCHEDULES",
    "AdaptiveEstimates",
    "AdaptiveGamma",
    "FixedGamma",
    "GammaSchedule",
    "HeuristicGamma",
    "RoundOutlook",
    "check_gamma",
    "make_schedule",
    "positions_tested",
]

ScheduleName = Literal["fixed", "heuristic", "adaptive"]
WILSON_Z = 1.64
"""z of a one-sided 95 % bound: how optimistic the adaptive schedule is about α it has not yet
measured well enough to rule drafting out."""
SCHEDULES: tuple[ScheduleName, ...] = ("fixed", "heuristic", "adaptive")
NOTED_READ = 32
"""A draft's catch-up of at least this many tokens is named in the round's note."""
DRAFT_COST_PRIOR = 0.25
"""c (a draft step over a target step) assumed for a drafter whose size is not known, before it
ever drafted: the packaged pairs measure 0.23–0.25 (docs/performance.md)."""


GAMMA_USE: dict[str, str] = {
    "fixed": "fixed drafts up to γ every round (the draft model stops sooner where its most likely "
    f"token had less than {DRAFT_STOP_BELOW})",
    "heuristic": f"heuristic starts at γ, then moves within 1–{GAMMA_MAX} (+2 after a round fully "
    "accepted, −1 otherwise)",
    "adaptive": "adaptive drafts γ (at most 3) in a drafter's first drafted rounds, until it has timed "
    f"that drafter's cost, then picks 0–{GAMMA_MAX} itself",
}
"""What each schedule does with the user's γ: the --gamma help and the docs say this."""
GAMMA_CHANGE: dict[str, str] = {
    "fixed": "a changed γ applies from the next round",
    "heuristic": "a changed γ restarts it from the new γ at the next round",
    "adaptive": "a changed γ counts only for a drafter's first drafts",
}
"""What a γ changed while a schedule runs (F2/F3, the advisor's key) does to it, from the next
round; tests/engine/test_gamma_changes.py pins each."""


def check_gamma(gamma: int) -> int:
    if not 1 <= gamma <= GAMMA_MAX:
        raise InvalidSettingError(f"gamma must be between 1 and {GAMMA_MAX} (got {gamma}).")
    return gamma


@dataclass(frozen=True, slots=True)
class RoundOutlook:
    """What the next round faces beyond a schedule's own measurements (from the reply)."""

    remaining: int | None = None
    """Tokens the reply may still produce (its budget left); None: not bounded."""
    produced: int = 0
    """Tokens the reply has produced so far."""
    behind: int = 0
    """Tokens the drafter must read before it drafts (:meth:`Drafter.behind`): the prompt at a
    reply's first draft, the tokens of plain rounds since the last one, else 1 or 2."""
    window: int | None = None
    """The most a catch-up may read when reading all it is behind on does not pay: the draft
    then reads only the last this many tokens (the ``draft_window`` setting); None: no window."""
    prefill_ms_per_token: float | None = None
    """The target's prefill of this reply, per token it read (None: too few read to tell)."""
    read_share: float | None = None
    """What reading a token costs the drafter as a share of the target's cost (None: unknown)."""

    @property
    def read_ms_per_token(self) -> float | None:
        """What the drafter is expected to pay per token it reads before one of its catch-ups
        was timed: the target's measured prefill per token, times the drafter's read share."""
        if self.prefill_ms_per_token is None or self.read_share is None:
            return None
        return self.prefill_ms_per_token * self.read_share


NO_OUTLOOK = RoundOutlook()


@dataclass(frozen=True, slots=True)
class CatchUp:
    """What a draft's catch-up would cost and what drafting could win back, for one choice of
    how much to read (all it is behind on, or a window)."""

    reads: int
    """Tokens it would read."""
    behind: int
    cost_ms: float
    gain_ms: float | None
    """The most drafting could save over the tokens the catch-up is judged on (None: no plain
    step timed yet to measure it against)."""
    horizon: int
    window: int | None
    """The window read (None: all it is behind on)."""
    speedup: float
    """The speed over plain decoding drafting is judged at."""

    @property
    def pays(self) -> bool:
        return self.gain_ms is None or self.gain_ms >= self.cost_ms

    def describe(self) -> str:
        """The trade in words, for notes: "the draft would first read 800 tokens (~5.2 s); …"."""
        read = f"the last {self.reads} of {self.behind}" if self.window else f"{self.reads}"
        text = f"the draft would first read {read} tokens (~{duration(self.cost_ms)})"
        if self.gain_ms is not None:
            win = f"can win at most ~{duration(self.gain_ms)} in {self.horizon} tokens"
            text += f"; drafting at {self.speedup:.2f}× {win}"
        return text


def duration(ms: float) -> str:
    return f"{ms:.0f} ms" if ms < 1000.0 else f"{ms / 1000.0:.1f} s"


class GammaSchedule(Protocol):
    name: str

    def next_gamma(self, source: DrafterName = "model", outlook: RoundOutlook = NO_OUTLOOK) -> int:
        """γ for the next round, whose draft ``source`` will propose (a lookup or the model)."""
        ...

    @property
    def note(self) -> str:
        """Why the latest γ was chosen, in a few words ("" when it only follows a setting)."""
        ...

    @property
    def window(self) -> int | None:
        """For the latest γ: draft from only the last this many tokens (a cheap probe by a
        drafter far behind), or None for the whole text."""
        ...

    def observe(self, event: RoundEvent) -> None: ...

    def begin_reply(self, gamma: Callable[[], int]) -> None:
        """A new reply starts; ``gamma`` reads the user's γ from now on. What was measured stays."""
        ...


class FixedGamma:
    """γ from a callable, read once per round: the caller may change it at any time."""

    name = "fixed"

    note = ""
    window: int | None = None

    def __init__(self, gamma: int | Callable[[], int]) -> None:
        self._read = gamma if callable(gamma) else (lambda: gamma)

    def next_gamma(self, source: DrafterName = "model", outlook: RoundOutlook = NO_OUTLOOK) -> int:
        return self._read()

    def observe(self, event: RoundEvent) -> None:
        pass

    def begin_reply(self, gamma: Callable[[], int]) -> None:
        self._read = gamma


class HeuristicGamma:
    """Transformers' assisted-generation rule: +2 after a fully accepted round, −1 otherwise.

    It starts from the user's γ, read once per round like the fixed schedule's: when the user
    changes γ (a key, the advisor), the rule restarts from the new γ at the next round. While
    the user's γ stays as it is, the γ the rule reached carries over, into the next reply too
    (as in transformers).
    """

    name = "heuristic"
    note = ""
    window: int | None = None

    def __init__(self, start: int | Callable[[], int], low: int = 1, high: int = GAMMA_MAX) -> None:
        self.low, self.high = low, high
        self._read = start if callable(start) else (lambda: start)
        self._user = self._read()
        """The user's γ when last read: a different one read later restarts the rule."""
        self.gamma = self._within(self._user)

    def _within(self, gamma: int) -> int:
        return min(max(gamma, self.low), self.high)

    def next_gamma(self, source: DrafterName = "model", outlook: RoundOutlook = NO_OUTLOOK) -> int:
        user = self._read()
        if user != self._user:
            self._user, self.gamma = user, self._within(user)
        return self.gamma

    def observe(self, event: RoundEvent) -> None:
        if event.drafted == 0:
            return
        step = 2 if event.accepted == event.drafted else -1
        self.gamma = self._within(self.gamma + step)

    def begin_reply(self, gamma: Callable[[], int]) -> None:
        self._read = gamma  # what it reached carries over, unless the user's γ has changed


@dataclass(frozen=True, slots=True)
class AdaptiveEstimates:
    """What the adaptive schedule currently believes (for status lines and the benchmark)."""

    alpha: float
    """Acceptance per tested draft position (decayed counts plus a weak prior)."""
    plain_ms: float | None
    """One plain target step."""
    draft_ms_per_token: float | None
    verify_ms: dict[int, float]
    """Predicted verify-pass cost for γ drafts (γ+1 positions), for γ = 0 … the largest allowed."""
    speedup: dict[int, float]
    """Predicted speed over plain decoding for each γ."""
    gamma: int

    @property
    def c(self) -> float | None:
        if self.plain_ms is None or self.draft_ms_per_token is None:
            return None
        return self.draft_ms_per_token / self.plain_ms


class AdaptiveGamma:
    """Chooses γ each round to maximise predicted tokens per second, from the rounds' own timings.

    A round with γ drafts is predicted to yield E[T](α, γ) = (1 − α^(γ+1)) / (1 − α) tokens for
    γ·d + V(γ) milliseconds, where α is the acceptance per tested position (recent rounds weigh
    more), d the drafter's milliseconds per drafted token (RoundEvent.draft_ms / drafted) and V(γ)
    the verify pass over γ+1 positions (RoundEvent.verify_ms, by width; widths not yet seen are
    interpolated linearly from the plain step V(0)). That is the seed formula
    E[T] / (γ·c + v(γ)) with c = d / V(0) and v(γ) = V(γ) / V(0), all measured live by the
    engine's one cost model (:class:`~specchat.engine.metrics.CostEstimator`).

    γ = 0, a plain target step, is always a candidate and is kept unless drafting is predicted to
    beat it by ``margin``: where speculation cannot pay, it is switched off. A draft model that
    has fallen behind (it reads the prompt only when it first drafts, and skips plain rounds)
    must catch up before it drafts; that one-off cost is weighed against what drafting would
    save over the tokens the reply may still produce, so a short reply after a long prompt is
    decoded plainly rather than pay for a draft that cannot earn its prefill back. While off, a
    probe round refreshes α (has the text turned predictable?) and the costs (has the machine
    changed?) whenever the plain decoding since the last draft has cost ``1 / probe_share`` times
    what the probe would add, so probing never costs more than that share of decoding time.

    The first rounds are plain steps (they measure V(0), again whenever its timings grow old); the
    first draft is the ``start`` γ the user set (at most 3, so that one unlucky first round costs
    little); after that γ may move anywhere
    in [0, ``cap``], at most two above the widest verify pass measured so far, and a neighbour
    of the best γ predicted nearly as fast is tried when its cost was timed too rarely or too
    long ago to rule it out. Speculation is switched off as soon as even the most α could
    plausibly be (a 95 % upper bound, :attr:`alpha_bounds`) could not pay for the measured costs,
    and by the point estimate of α once ``min_evidence`` draft positions were tested; once off,
    it comes back on when even the least α could plausibly be would pay. Estimates are kept per
    drafter, so switching drafters mid-reply is fine. :attr:`note` says why the latest γ was
    chosen; the engine stamps it on the round's event.
    """

    name = "adaptive"

    def __init__(
        self,
        start: int | Callable[[], int] = 4,
        *,
        cap: int = GAMMA_MAX,
        margin: float = 0.03,
        decay: float = 0.97,
        prior_alpha: float = 0.7,
        prior_weight: float = 1.0,
        min_evidence: float = 8.0,
        probe_first: int = 8,
        probe_share: float = 0.02,
        refresh_slack: float = 0.15,
        catch_up_prior: float = 0.25,
        probe_window: int = 48,
    ) -> None:
        self._start = start if callable(start) else (lambda: start)
        self.cap = min(max(cap, 1), GAMMA_MAX)
        self.margin = margin
        self.decay = decay
        self.prior_alpha = prior_alpha
        self.prior_weight = prior_weight
        self.min_evidence = min_evidence
        self.probe_first = probe_first
        """The fewest plain rounds between a draft and a probe."""
        self.probe_share = probe_share
        """The most of the plain decoding time, while drafting is off, that probes may add."""
        self.refresh_slack = refresh_slack
        """How much slower than the best a neighbouring γ may be predicted and still be timed
        again when its timings are few or old (at most a few rounds per width in sixty-four)."""
        self.probe_window = probe_window
        """A probe by a drafter further behind than this drafts from only the last this many
        tokens: its cost stays bounded however long drafting was off (its α a little low)."""
        self.window: int | None = None
        self.catch_up_prior = catch_up_prior
        """A draft model's catch-up per token, as a share of its per-token drafting cost, until
        a catch-up is timed (a prefill reads tokens in one batched pass, several times cheaper
        per token than drafting them one at a time: 0.2 on the default pair)."""
        self._read_ms_per_token: float | None = None
        """The latest reply's estimate of a catch-up's price from the target's prefill, kept for
        replies whose prefill read too little to tell (a short message after a long reply)."""
        self.drafter = "model"
        """Drafter of the latest observed round; estimates below are looked up for it."""
        self.costs = CostEstimator()
        """c, v(γ) and the draft's catch-up, from the rounds this schedule observed."""
        self.note = ""
        self._accepted: dict[str, float] = {}
        self._tested: dict[str, float] = {}
        self._sure_accepted: dict[str, float] = {}
        self._sure_tested: dict[str, float] = {}
        self._rounds = 0
        self._plain_streak = 0
        self._plain_ms_since_draft = 0.0
        self._gamma = 0
        self._probe_soon: set[str] = set()
        """Drafters whose latest probe went through whole: their next probe comes soon."""
        self._off: set[str] = set()
        """Drafters the schedule turned off for want of pay (until even α's lower bound pays)."""

    def begin_reply(self, gamma: Callable[[], int]) -> None:
        """Keep the measured costs and α (decayed as ever): later replies start informed, so their
        first rounds neither re-measure a plain step nor try a γ the measurements rule out."""
        self._start = gamma
        self._plain_streak = 0
        self._plain_ms_since_draft = 0.0

    # ------------------------------------------------------------------ observation
    def observe(self, event: RoundEvent) -> None:
        self._rounds += 1
        self.drafter = event.drafter if proposes(event.drafter) else self.drafter
        self.costs.observe(event)
        if event.drafted == 0:
            self._plain_streak += 1
            spent = event.draft_ms + event.verify_ms
            self._plain_ms_since_draft += spent if known(spent) else (self.costs.plain_ms or 0.0)
            return
        name = event.drafter
        tested = positions_tested(event)
        keep = self.decay**tested  # forget per tested position: recent text weighs more
        if name in self._off:
            # A probe that went through whole is a sign the text changed: the α measured before
            # it counts for half, and this drafter's next probe comes soon, so a few such probes
            # in a row bring drafting back, not dozens spread over the budget. Only its own: a
            # lookup that hit says nothing of the draft model, whose probe costs a catch-up.
            whole = event.accepted == event.drafted
            keep *= 0.5 if whole else 1.0
            if whole:
                self._probe_soon.add(name)
            else:
                self._probe_soon.discard(name)
        self._accepted[name] = keep * self._accepted.get(name, 0.0) + event.accepted
        self._tested[name] = keep * self._tested.get(name, 0.0) + tested
        sure_accepted, sure_tested = sure_positions(event)
        self._sure_accepted[name] = keep * self._sure_accepted.get(name, 0.0) + sure_accepted
        self._sure_tested[name] = keep * self._sure_tested.get(name, 0.0) + sure_tested
        self._plain_streak = 0
        self._plain_ms_since_draft = 0.0

    # ------------------------------------------------------------------ estimates
    @property
    def alpha(self) -> float:
        return self._alpha_of(self._accepted, self._tested)

    @property
    def sure_alpha(self) -> float:
        """α over the positions the draft model was sure of (see :func:`sure_positions`)."""
        return self._alpha_of(self._sure_accepted, self._sure_tested)

    @property
    def alpha_bounds(self) -> tuple[float, float]:
        """The least and the most α could plausibly be given the positions tested so far: the
        ends of one-sided 95 % Wilson intervals on the (decayed, prior-weighted) counts."""
        n = self._tested.get(self.drafter, 0.0) + self.prior_weight
        p = self.alpha
        z2 = WILSON_Z**2
        centre = (p + z2 / (2.0 * n)) / (1.0 + z2 / n)
        spread = WILSON_Z * math.sqrt(p * (1.0 - p) / n + z2 / (4.0 * n * n)) / (1.0 + z2 / n)
        return max(centre - spread, 0.0), min(centre + spread, 1.0)

    def _alpha_of(self, accepted: dict[str, float], tested: dict[str, float]) -> float:
        name = self.drafter
        hits = accepted.get(name, 0.0) + self.prior_alpha * self.prior_weight
        return hits / (tested.get(name, 0.0) + self.prior_weight)

    def _verify_ms(self, gamma: int) -> float | None:
        """V(γ): measured median for this width, else the cost model's line through the widths."""
        return self.costs.plain_ms if gamma == 0 else self.costs.verify_ms(gamma)

    @property
    def evidence(self) -> float:
        """Draft positions tested so far for the current drafter (decayed)."""
        return self._tested.get(self.drafter, 0.0)

    def _speedups(self, alpha: float | None = None) -> dict[int, float]:
        """Predicted speed over plain decoding for each allowed γ ≥ 1 (empty until measurable)."""
        model = self.costs.model(self.drafter)
        if model is None:
            return {}
        alpha = self.alpha if alpha is None else alpha
        return model.curve(alpha, range(1, min(self.cap, self.costs.widest + 2) + 1))

    def catch_up_ms_per_token(self, outlook: RoundOutlook = NO_OUTLOOK) -> float | None:
        """What the current drafter pays per token it catches up on: timed, else the reply's
        estimate from the target's prefill, else a share of its drafting cost."""
        timed = self.costs.catch_up_ms(self.drafter)
        if timed is not None:
            return timed
        if self._read_ms_per_token is not None:
            return self._read_ms_per_token
        per_token = self.costs.draft_ms(self.drafter)
        return None if per_token is None else self.catch_up_prior * per_token

    def estimates(self) -> AdaptiveEstimates:
        widths = range(0, min(self.cap, self.costs.widest + 2) + 1)
        verify = {g: v for g in widths if (v := self._verify_ms(g)) is not None}
        return AdaptiveEstimates(
            alpha=self.alpha,
            plain_ms=self.costs.plain_ms,
            draft_ms_per_token=self.costs.draft_ms(self.drafter),
            verify_ms=verify,
            speedup=self._speedups(),
            gamma=self._gamma,
        )

    # ------------------------------------------------------------------ decision
    def next_gamma(self, source: DrafterName = "model", outlook: RoundOutlook = NO_OUTLOOK) -> int:
        # A hybrid drafter alternates sources: decide with the estimates of the one about to propose.
        self.drafter = source
        self.window = None
        if outlook.read_ms_per_token is not None:
            self._read_ms_per_token = outlook.read_ms_per_token
        self._gamma, self.note = self._decide(outlook)
        return self._gamma

    def _decide(self, outlook: RoundOutlook) -> tuple[int, str]:
        # The plain step is the yardstick every cost is divided by: timed like any width, a few
        # times and again when old. One slow first step (it follows the prompt's prefill) once
        # stood for V(0) all reply, and the fit read every wider pass as costing one step.
        if self.costs.needs_refresh(0):
            return 0, "plain: timing plain steps, the yardstick every cost is measured against"
        predicted = self._speedups()
        if not predicted:  # nothing drafted by this drafter yet: try the user's γ
            ceiling = self._first_draft_ceiling(outlook)
            catch_up = self._catch_up(ceiling, outlook)
            if catch_up is None:
                return 0, self._why_not_catch_up(ceiling, outlook)
            gamma = min(max(self._start(), 1), 3, self.cap)
            return (
                gamma,
                f"γ {gamma}: a first {self.drafter} draft, to measure α and its cost"
                + self._reading(catch_up),
            )
        # Whether drafting pays is judged on every tested position; how far to draft, on those
        # the draft was sure of, since the draft itself ends a round where it is unsure.
        sizing = self._speedups(alpha=self.sure_alpha)
        best = max(sizing, key=lambda g: sizing[g])
        top = max(predicted.values())
        off = self.drafter in self._off
        if off:
            # Coming back on costs a catch-up: the least α could plausibly be (a 95 % lower
            # bound), not the estimate, must pay, so one lucky probe near the break-even point
            # does not start a run of losing rounds. Probes gather the evidence.
            top = max(self._speedups(alpha=self.alpha_bounds[0]).values())
        if top >= 1.0 + self.margin:
            catch_up = self._catch_up(top, outlook)
            if catch_up is None:
                return 0, self._why_not_catch_up(top, outlook)
            self._off.discard(self.drafter)
            gamma = self._refresh_or(best, sizing)
            figures = f"predicted {predicted[gamma]:.2f}× ({self._figures(gamma)})"
            return gamma, f"γ {gamma}: {figures}" + self._reading(catch_up)
        if self.evidence < self.min_evidence and not off:
            # Too few positions to blame α yet: keep measuring while the most α could plausibly
            # be (its upper confidence bound) would still pay.
            ceiling = max(self._speedups(alpha=self.alpha_bounds[1]).values())
            catch_up = self._catch_up(ceiling, outlook) if ceiling >= 1.0 + self.margin else None
            if catch_up is not None:
                tested = f"{self.evidence:.0f} of {self.min_evidence:.0f} positions tested"
                return best, f"γ {best}: measuring α before judging it ({tested})" + self._reading(catch_up)
        if self._probe_due(best, outlook):
            self.window = self._probe_window(outlook)
            read = f", from the last {self.window} tokens" if self.window else ""
            why = "has the text or the machine changed?"
            return best, f"γ {best}: a probe while drafting is off{read} ({why})"
        self._off.add(self.drafter)
        if off and max(predicted.values()) >= 1.0 + self.margin:
            return 0, self._why_not_sure(predicted)
        return 0, self._why_off(predicted)

    def _figures(self, gamma: int) -> str:
        model = self.costs.model(self.drafter)
        assert model is not None  # predictions exist
        return f"α {self.alpha:.2f}, c {model.c:.2f}, v({gamma}) {model.v(gamma):.2f}"

    def _why_off(self, predicted: dict[int, float]) -> str:
        """Why drafting is off: what the best γ would cost against the tokens it would bring."""
        best = max(predicted, key=lambda g: predicted[g])
        model = self.costs.model(self.drafter)
        assert model is not None
        cost = best * model.c + model.v(best)
        earned = expected_tokens_per_round(self.alpha, best)
        return (
            f"plain: drafting cannot pay; at best γ {best}, γ·c + v = {cost:.2f} steps bring "
            f"E[T] = {earned:.2f} tokens ({predicted[best]:.2f}×; {self._figures(best)})"
        )

    def _why_not_sure(self, predicted: dict[int, float]) -> str:
        """Why drafting stays off although α's estimate says it would pay: coming back on needs
        even α's lower bound to pay, and the probes have not yet tested enough positions."""
        low = self.alpha_bounds[0]
        at_low = max(self._speedups(alpha=low).values())
        return (
            f"plain: drafting cannot pay for sure yet; {max(predicted.values()):.2f}× at α "
            f"{self.alpha:.2f}, {at_low:.2f}× at its 95 % lower bound {low:.2f} (probes measure α)"
        )

    def _catch_up_cost_ms(self, outlook: RoundOutlook, reads: int | None = None) -> float:
        """The one-off part of the next draft: reading ``reads`` tokens (all it is behind on)."""
        reads = outlook.behind if reads is None else reads
        if reads <= ROUTINE_CATCH_UP:
            return 0.0
        return reads * (self.catch_up_ms_per_token(outlook) or 0.0)

    @staticmethod
    def horizon(outlook: RoundOutlook) -> int:
        """The tokens a catch-up is judged on: as many as the reply has produced so far, and no
        more than its budget left.

        How long a reply will run is unknown: a RAG or extraction answer may end after 13
        tokens, a story after 500. Judged on the tokens already produced, the draft reads a
        long prompt once drafting could have won the read back in the reply so far (the ski
        rental rule): a reply that ends early never paid for a read, and a long one loses at
        most about what the read costs, since until then lookups still draft.
        """
        if outlook.remaining is None:
            return outlook.produced
        return min(outlook.produced, outlook.remaining)

    def _trade(self, speedup: float, outlook: RoundOutlook, window: int | None) -> CatchUp:
        reads = min(outlook.behind, window) if window else outlook.behind
        horizon = self.horizon(outlook)
        plain_ms = self.costs.plain_ms
        gain = None
        if plain_ms is not None:
            gain = horizon * plain_ms * max(1.0 - 1.0 / speedup, 0.0)
        cost = self._catch_up_cost_ms(outlook, reads)
        return CatchUp(reads, outlook.behind, cost, gain, horizon, window, speedup)

    def _catch_up(self, speedup: float, outlook: RoundOutlook) -> CatchUp | None:
        """How the drafter should catch up before drafting at ``speedup``: read all it is behind
        on where that pays, else only the last ``outlook.window`` tokens where that pays (its
        guesses worse, but drafting on), else None: decode plainly (lookups still draft, free).

        Sets :attr:`window` for the round. Exactness does not depend on what the draft read: the
        target verifies whatever it proposes against the distribution it drew from.
        """
        whole = self._trade(speedup, outlook, None)
        if whole.pays:
            return whole
        window = outlook.window
        if window is not None and outlook.behind > window:
            part = self._trade(speedup, outlook, window)
            if part.pays:
                self.window = window
                return part
        return None

    def _reading(self, catch_up: CatchUp) -> str:
        """A note's tail for a round that first reads a long way (empty for a routine round)."""
        if catch_up.reads < NOTED_READ or catch_up.cost_ms == 0.0:
            return ""
        return f"; {catch_up.describe()}"

    def _first_draft_ceiling(self, outlook: RoundOutlook) -> float:
        """The most a drafter never measured could plausibly win: the seed formula at the prior
        α, with its drafting cost as its read share (a draft step over a target step is about
        the ratio of their weights) and a verify pass costing no more than a plain step."""
        c = DRAFT_COST_PRIOR if outlook.read_share is None else outlook.read_share
        gammas = range(1, self.cap + 1)
        return max(expected_tokens_per_round(self.prior_alpha, g) / (g * c + 1.0) for g in gammas)

    def _why_not_catch_up(self, speedup: float, outlook: RoundOutlook) -> str:
        whole = self._trade(speedup, outlook, None)
        why = f"plain: {whole.describe()}"
        if outlook.window is not None and outlook.behind > outlook.window:
            part = self._trade(speedup, outlook, outlook.window)
            why += (
                f"; reading only the last {outlook.window} (~{duration(part.cost_ms)}) would not pay either"
            )
        return why

    def _probe_window(self, outlook: RoundOutlook) -> int | None:
        return self.probe_window if outlook.behind > self.probe_window else None

    def _probe_due(self, gamma: int, outlook: RoundOutlook) -> bool:
        """A probe when the plain time since the last draft is 1/probe_share times its extra cost."""
        model = self.costs.model(self.drafter)
        if self._plain_streak < self.probe_first or model is None:
            return False
        if outlook.remaining is not None and outlook.remaining <= self.probe_first:
            return False  # what it would measure ends with the reply
        if self.drafter in self._probe_soon:
            return True
        reads = min(outlook.behind, self.probe_window)
        extra = (
            self._catch_up_cost_ms(outlook, reads)
            + gamma * model.draft_ms
            + model.verify(gamma)
            - model.plain_ms
        )
        return self._plain_ms_since_draft * self.probe_share >= extra

    def _refresh_or(self, best: int, predicted: dict[int, float]) -> int:
        """``best``, or a neighbouring γ predicted nearly as fast whose verify cost rests on too
        few or too old timings (CostEstimator.needs_refresh): without this, one slow pass timed
        at a width would rule it out for good, since it is never tried again."""
        for gamma in (best - 1, best + 1):
            close = predicted.get(gamma, 0.0) >= predicted[best] * (1.0 - self.refresh_slack)
            if gamma >= 1 and close and self.costs.needs_refresh(gamma):
                return gamma
        return best


def sure_positions(event: RoundEvent) -> tuple[int, int]:
    """(accepted, tested) over the round's positions the draft model was sure of.

    A model draft shorter than the γ asked ended where the draft was unsure of its last token
    (ModelDrafter.stop_below); that position, when tested, is left out, so that the estimate
    says how far a confident draft holds up.
    """
    accepted, tested = event.accepted, positions_tested(event)
    cut_short = is_model(event.drafter) and 0 < event.drafted < event.gamma
    if cut_short and tested == event.drafted:
        return accepted - (accepted == event.drafted), tested - 1
    return accepted, tested


def make_schedule(name: str, gamma: int | Callable[[], int]) -> GammaSchedule:
    if name == "fixed":
        return FixedGamma(gamma)
    if name == "heuristic":
        return HeuristicGamma(gamma)
    if name == "adaptive":
        return AdaptiveGamma(gamma)
    raise InvalidSettingError(f"unknown gamma schedule {name!r}: choose one of {', '.join(SCHEDULES)}.")
