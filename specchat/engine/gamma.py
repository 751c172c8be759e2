"""γ schedules: how many tokens to draft next round.

The engine asks a schedule once per round (``next_gamma``) and reports each finished round
(``observe``), so a key press changing γ between rounds never races the loop. A schedule may
answer 0: the round then drafts nothing and is one plain target step.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol

from specchat.engine.events import DrafterName, RoundEvent
from specchat.engine.metrics import CostEstimator, positions_tested
from specchat.engine.params import GAMMA_MAX
from specchat.engine.registry import is_model, proposes
from specchat.errors import InvalidSettingError

__all__ = [
    "GAMMA_MAX",
    "SCHEDULES",
    "AdaptiveEstimates",
    "AdaptiveGamma",
    "FixedGamma",
    "GammaSchedule",
    "HeuristicGamma",
    "check_gamma",
    "make_schedule",
    "positions_tested",
]

ScheduleName = Literal["fixed", "heuristic", "adaptive"]
SCHEDULES: tuple[ScheduleName, ...] = ("fixed", "heuristic", "adaptive")


def check_gamma(gamma: int) -> int:
    if not 1 <= gamma <= GAMMA_MAX:
        raise InvalidSettingError(f"gamma must be between 1 and {GAMMA_MAX} (got {gamma}).")
    return gamma


class GammaSchedule(Protocol):
    name: str

    def next_gamma(self, source: DrafterName = "model") -> int:
        """γ for the next round, whose draft ``source`` will propose (a lookup or the model)."""
        ...

    def observe(self, event: RoundEvent) -> None: ...

    def begin_reply(self, gamma: Callable[[], int]) -> None:
        """A new reply starts; ``gamma`` reads the user's γ from now on. What was measured stays."""
        ...


class FixedGamma:
    """γ from a callable, read once per round: the caller may change it at any time."""

    name = "fixed"

    def __init__(self, gamma: int | Callable[[], int]) -> None:
        self._read = gamma if callable(gamma) else (lambda: gamma)

    def next_gamma(self, source: DrafterName = "model") -> int:
        return self._read()

    def observe(self, event: RoundEvent) -> None:
        pass

    def begin_reply(self, gamma: Callable[[], int]) -> None:
        self._read = gamma


class HeuristicGamma:
    """Transformers' assisted-generation rule: +2 after a fully accepted round, −1 otherwise."""

    name = "heuristic"

    def __init__(self, start: int, low: int = 1, high: int = GAMMA_MAX) -> None:
        self.low, self.high = low, high
        self.gamma = min(max(start, low), high)

    def next_gamma(self, source: DrafterName = "model") -> int:
        return self.gamma

    def observe(self, event: RoundEvent) -> None:
        if event.drafted == 0:
            return
        step = 2 if event.accepted == event.drafted else -1
        self.gamma = min(max(self.gamma + step, self.low), self.high)

    def begin_reply(self, gamma: Callable[[], int]) -> None:
        pass  # as in transformers, the γ it reached carries over to the next reply


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
    beat it by ``margin``: where speculation cannot pay, it is switched off. While off, a probe
    round now and then (at growing intervals, so that probes cost almost nothing) refreshes α in
    case the text turns predictable.

    The first round is a plain step (it measures V(0)); the second drafts the ``start`` γ the user
    set (at most 3, so that one unlucky first round costs little); after that γ may move anywhere
    in [0, ``cap``], at most two above the widest verify pass measured so far, and a neighbour
    of the best γ predicted nearly as fast is tried when its cost was timed too rarely or too
    long ago to rule it out. Speculation is
    switched off at once if even perfect acceptance could not pay for the measured costs, but
    for low acceptance only after ``min_evidence`` draft positions were tested, since one round
    says little about α. Estimates are kept per drafter, so switching drafters mid-reply is fine.
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
        prior_weight: float = 3.0,
        min_evidence: float = 12.0,
        probe_first: int = 8,
        probe_max: int = 128,
        refresh_slack: float = 0.15,
    ) -> None:
        self._start = start if callable(start) else (lambda: start)
        self.cap = min(max(cap, 1), GAMMA_MAX)
        self.margin = margin
        self.decay = decay
        self.prior_alpha = prior_alpha
        self.prior_weight = prior_weight
        self.min_evidence = min_evidence
        self.probe_first = probe_first
        self.probe_max = probe_max
        self.refresh_slack = refresh_slack
        """How much slower than the best a neighbouring γ may be predicted and still be timed
        again when its timings are few or old (at most a few rounds per width in sixty-four)."""
        self.drafter = "model"
        """Drafter of the latest observed round; estimates below are looked up for it."""
        self.costs = CostEstimator()
        """c and v(γ), from the rounds this schedule observed."""
        self._accepted: dict[str, float] = {}
        self._tested: dict[str, float] = {}
        self._sure_accepted: dict[str, float] = {}
        self._sure_tested: dict[str, float] = {}
        self._rounds = 0
        self._plain_streak = 0
        self._probe_interval = probe_first
        self._gamma = 0

    def begin_reply(self, gamma: Callable[[], int]) -> None:
        """Keep the measured costs and α (decayed as ever): later replies start informed, so their
        first rounds neither re-measure a plain step nor try a γ the measurements rule out."""
        self._start = gamma
        self._plain_streak = 0
        self._probe_interval = self.probe_first
        self.costs.begin_reply()

    # ------------------------------------------------------------------ observation
    def observe(self, event: RoundEvent) -> None:
        self._rounds += 1
        self.drafter = event.drafter if proposes(event.drafter) else self.drafter
        self.costs.observe(event)
        if event.drafted == 0:
            self._plain_streak += 1
            return
        name = event.drafter
        tested = positions_tested(event)
        keep = self.decay**tested  # forget per tested position: recent text weighs more
        self._accepted[name] = keep * self._accepted.get(name, 0.0) + event.accepted
        self._tested[name] = keep * self._tested.get(name, 0.0) + tested
        sure_accepted, sure_tested = sure_positions(event)
        self._sure_accepted[name] = keep * self._sure_accepted.get(name, 0.0) + sure_accepted
        self._sure_tested[name] = keep * self._sure_tested.get(name, 0.0) + sure_tested
        self._plain_streak = 0
        predicted = self._speedups()
        if predicted and max(predicted.values()) >= 1.0 + self.margin:
            self._probe_interval = self.probe_first
        else:
            self._probe_interval = min(self._probe_interval * 2, self.probe_max)

    # ------------------------------------------------------------------ estimates
    @property
    def alpha(self) -> float:
        return self._alpha_of(self._accepted, self._tested)

    @property
    def sure_alpha(self) -> float:
        """α over the positions the draft model was sure of (see :func:`sure_positions`)."""
        return self._alpha_of(self._sure_accepted, self._sure_tested)

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
    def next_gamma(self, source: DrafterName = "model") -> int:
        # A hybrid drafter alternates sources: decide with the estimates of the one about to propose.
        self.drafter = source
        self._gamma = self._decide()
        return self._gamma

    def _decide(self) -> int:
        if self.costs.plain_ms is None:
            return 0  # measure a plain step first: it is the yardstick
        predicted = self._speedups()
        if not predicted:
            return min(max(self._start(), 1), 3, self.cap)  # nothing drafted yet: try the user's γ
        # Whether drafting pays is judged on every tested position; how far to draft, on those
        # the draft was sure of, since the draft itself ends a round where it is unsure.
        sizing = self._speedups(alpha=self.sure_alpha)
        best = max(sizing, key=lambda g: sizing[g])
        if max(predicted.values()) >= 1.0 + self.margin:
            return self._refresh_or(best, sizing)
        if self.evidence < self.min_evidence:
            ceiling = self._speedups(alpha=1.0)
            if max(ceiling.values()) >= 1.0 + self.margin:
                return best  # too early to blame α: keep measuring it
        if self._plain_streak >= self._probe_interval:
            return best  # a probe: has the text become predictable?
        return 0

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
        return HeuristicGamma(gamma() if callable(gamma) else gamma)
    if name == "adaptive":
        return AdaptiveGamma(gamma)
    raise InvalidSettingError(f"unknown gamma schedule {name!r}: choose one of {', '.join(SCHEDULES)}.")
