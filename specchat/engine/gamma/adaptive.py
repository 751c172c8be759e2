"""The adaptive γ schedule's decision: which γ to draft next round, whether the draft reads all
it is behind on or only a window, and when to probe while drafting is off. What it has measured
is :class:`~specchat.engine.gamma.estimates.Measurements`; its notes are worded in
:mod:`specchat.engine.gamma.words`."""

from __future__ import annotations

from collections.abc import Callable

import specchat.engine.gamma.words as words
from specchat.engine.costs import CostEstimator, expected_tokens_per_round
from specchat.engine.events import DrafterName, RoundEvent, known
from specchat.engine.gamma.base import NO_OUTLOOK, RoundOutlook
from specchat.engine.gamma.catch_up import CatchUp, catch_up_cost_ms, horizon, trade
from specchat.engine.gamma.estimates import AdaptiveEstimates, Measurements
from specchat.engine.registry import proposes
from specchat.params import GAMMA_MAX

DRAFT_COST_PRIOR = 0.25
"""c (a draft step over a target step) assumed for a drafter whose size is not known, before it
ever drafted: the packaged pairs measure 0.23–0.25 (docs/performance.md)."""


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
        self.measured = Measurements(
            decay=decay, prior_alpha=prior_alpha, prior_weight=prior_weight, catch_up_prior=catch_up_prior
        )
        """What it has measured: α, the rounds' costs, a catch-up's price (``decay``,
        ``prior_alpha``, ``prior_weight`` and ``catch_up_prior`` are its knobs)."""
        self.costs: CostEstimator = self.measured.costs
        self.cap = min(max(cap, 1), GAMMA_MAX)
        self.margin = margin
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
        self.drafter = "model"
        """Drafter of the latest observed round; estimates below are looked up for it."""
        self.note = ""
        self._rounds = 0
        self._plain_streak = 0
        self._plain_ms_since_draft = 0.0
        self._gamma = 0
        self._probe_soon: set[str] = set()
        """Drafters whose latest probe went through whole: their next probe comes soon."""
        self._off: set[str] = set()
        """Drafters the schedule turned off for want of pay (until even α's lower bound pays)."""

    @property
    def prior_alpha(self) -> float:
        return self.measured.prior_alpha

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
        history = 1.0
        if name in self._off:
            # A probe that went through whole is a sign the text changed: the α measured before
            # it counts for half, and this drafter's next probe comes soon, so a few such probes
            # in a row bring drafting back, not dozens spread over the budget. Only its own: a
            # lookup that hit says nothing of the draft model, whose probe costs a catch-up.
            whole = event.accepted == event.drafted
            history = 0.5 if whole else 1.0
            if whole:
                self._probe_soon.add(name)
            else:
                self._probe_soon.discard(name)
        self.measured.count(event, history=history)
        self._plain_streak = 0
        self._plain_ms_since_draft = 0.0

    # ------------------------------------------------------------------ estimates (the current drafter's)
    @property
    def alpha(self) -> float:
        return self.measured.alpha(self.drafter)

    @property
    def sure_alpha(self) -> float:
        """α over the positions the draft model was sure of (see :func:`sure_positions`)."""
        return self.measured.sure_alpha(self.drafter)

    @property
    def alpha_bounds(self) -> tuple[float, float]:
        """The least and the most α could plausibly be (one-sided 95 % Wilson bounds)."""
        return self.measured.alpha_bounds(self.drafter)

    @property
    def evidence(self) -> float:
        """Draft positions tested so far for the current drafter (decayed)."""
        return self.measured.evidence(self.drafter)

    def _speedups(self, alpha: float | None = None) -> dict[int, float]:
        return self.measured.speedups(self.drafter, self.cap, alpha)

    def catch_up_ms_per_token(self, outlook: RoundOutlook = NO_OUTLOOK) -> float | None:
        """What the current drafter pays per token it catches up on: timed, else the reply's
        estimate from the target's prefill, else a share of its drafting cost."""
        return self.measured.catch_up_ms_per_token(self.drafter)

    def estimates(self) -> AdaptiveEstimates:
        return self.measured.estimates(self.drafter, self.cap, self._gamma)

    # ------------------------------------------------------------------ decision
    def next_gamma(self, source: DrafterName = "model", outlook: RoundOutlook = NO_OUTLOOK) -> int:
        # A hybrid drafter alternates sources: decide with the estimates of the one about to propose.
        self.drafter = source
        self.window = None
        if outlook.read_ms_per_token is not None:
            self.measured.read_ms_per_token = outlook.read_ms_per_token
        self._gamma, self.note = self._decide(outlook)
        return self._gamma

    def _decide(self, outlook: RoundOutlook) -> tuple[int, str]:
        # The plain step is the yardstick every cost is divided by: timed like any width, a few
        # times and again when old. One slow first step (it follows the prompt's prefill) once
        # stood for V(0) all reply, and the fit read every wider pass as costing one step.
        if self.costs.needs_refresh(0):
            return 0, words.TIMING_PLAIN
        predicted = self._speedups()
        if not predicted:  # nothing drafted by this drafter yet: try the user's γ
            ceiling = self._first_draft_ceiling(outlook)
            catch_up = self._catch_up(ceiling, outlook)
            if catch_up is None:
                return 0, self._why_not_catch_up(ceiling, outlook)
            gamma = min(max(self._start(), 1), 3, self.cap)
            return gamma, words.first_draft(gamma, self.drafter, catch_up)
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
            model = self.costs.model(self.drafter)
            assert model is not None  # predictions exist
            return gamma, words.predicted(gamma, predicted[gamma], self.drafter, self.alpha, model, catch_up)
        if self.evidence < self.min_evidence and not off:
            # Too few positions to blame α yet: keep measuring while the most α could plausibly
            # be (its upper confidence bound) would still pay.
            ceiling = max(self._speedups(alpha=self.alpha_bounds[1]).values())
            catch_up = self._catch_up(ceiling, outlook) if ceiling >= 1.0 + self.margin else None
            if catch_up is not None:
                return best, words.measuring(best, self.evidence, self.min_evidence, catch_up)
        if self._probe_due(best, outlook):
            self.window = self._probe_window(outlook)
            return best, words.probe(best, self.window)
        self._off.add(self.drafter)
        if off and max(predicted.values()) >= 1.0 + self.margin:
            low = self.alpha_bounds[0]
            at_low = max(self._speedups(alpha=low).values())
            return 0, words.why_not_sure(predicted, self.alpha, low, at_low)
        model = self.costs.model(self.drafter)
        assert model is not None
        return 0, words.why_off(predicted, self.drafter, self.alpha, model)

    @staticmethod
    def horizon(outlook: RoundOutlook) -> int:
        """The tokens a catch-up is judged on (:func:`~specchat.engine.gamma.catch_up.horizon`)."""
        return horizon(outlook)

    def _trade(self, speedup: float, outlook: RoundOutlook, window: int | None) -> CatchUp:
        per_token = self.catch_up_ms_per_token(outlook)
        return trade(speedup, outlook, window, self.costs.plain_ms, per_token)

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

    def _first_draft_ceiling(self, outlook: RoundOutlook) -> float:
        """The most a drafter never measured could plausibly win: the seed formula at the prior
        α, with its drafting cost as its read share (a draft step over a target step is about
        the ratio of their weights) and a verify pass costing no more than a plain step."""
        c = DRAFT_COST_PRIOR if outlook.read_share is None else outlook.read_share
        gammas = range(1, self.cap + 1)
        return max(expected_tokens_per_round(self.prior_alpha, g) / (g * c + 1.0) for g in gammas)

    def _why_not_catch_up(self, speedup: float, outlook: RoundOutlook) -> str:
        whole = self._trade(speedup, outlook, None)
        part = None
        if outlook.window is not None and outlook.behind > outlook.window:
            part = self._trade(speedup, outlook, outlook.window)
        return words.why_not_catch_up(whole, part)

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
        catch_up = catch_up_cost_ms(reads, self.catch_up_ms_per_token(outlook))
        extra = catch_up + gamma * model.draft_ms + model.verify(gamma) - model.plain_ms
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
