"""What the adaptive schedule has measured, per drafter: α over the draft positions tested (all
of them, and those the draft was sure of), what rounds cost (c and v(γ), from the engine's one
:class:`~specchat.engine.metrics.CostEstimator`) and what a draft model's catch-up costs per
token. Estimation only: which γ to draft is :mod:`specchat.engine.gamma.adaptive`'s decision."""

from __future__ import annotations

import math
from dataclasses import dataclass

from specchat.engine.costs import CostEstimator
from specchat.engine.events import RoundEvent
from specchat.engine.metrics import positions_tested
from specchat.engine.registry import is_model

WILSON_Z = 1.64
"""z of a one-sided 95 % bound: how optimistic the adaptive schedule is about α it has not yet
measured well enough to rule drafting out."""


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


class Measurements:
    """α per drafter from decayed counts plus a weak prior, the rounds' costs, and a catch-up's
    price, from the rounds the schedule observed."""

    def __init__(
        self, *, decay: float, prior_alpha: float, prior_weight: float, catch_up_prior: float
    ) -> None:
        self.decay = decay
        self.prior_alpha = prior_alpha
        self.prior_weight = prior_weight
        self.catch_up_prior = catch_up_prior
        """A draft model's catch-up per token, as a share of its per-token drafting cost, until
        a catch-up is timed (a prefill reads tokens in one batched pass, several times cheaper
        per token than drafting them one at a time: 0.2 on the default pair)."""
        self.read_ms_per_token: float | None = None
        """The latest reply's estimate of a catch-up's price from the target's prefill, kept for
        replies whose prefill read too little to tell (a short message after a long reply)."""
        self.costs = CostEstimator()
        """c, v(γ) and the draft's catch-up, from the rounds this schedule observed."""
        self._accepted: dict[str, float] = {}
        self._tested: dict[str, float] = {}
        self._sure_accepted: dict[str, float] = {}
        self._sure_tested: dict[str, float] = {}

    def count(self, event: RoundEvent, *, history: float = 1.0) -> None:
        """A drafted round's accepted and tested positions, for its drafter. What was counted
        before is forgotten per tested position (recent text weighs more), and further scaled
        by ``history`` (the decision halves it where the text seems to have changed)."""
        name = event.drafter
        tested = positions_tested(event)
        keep = self.decay**tested * history
        self._accepted[name] = keep * self._accepted.get(name, 0.0) + event.accepted
        self._tested[name] = keep * self._tested.get(name, 0.0) + tested
        sure_accepted, sure_tested = sure_positions(event)
        self._sure_accepted[name] = keep * self._sure_accepted.get(name, 0.0) + sure_accepted
        self._sure_tested[name] = keep * self._sure_tested.get(name, 0.0) + sure_tested

    def alpha(self, drafter: str) -> float:
        return self._alpha_of(drafter, self._accepted, self._tested)

    def sure_alpha(self, drafter: str) -> float:
        """α over the positions the draft model was sure of (see :func:`sure_positions`)."""
        return self._alpha_of(drafter, self._sure_accepted, self._sure_tested)

    def alpha_bounds(self, drafter: str) -> tuple[float, float]:
        """The least and the most α could plausibly be given the positions tested so far: the
        ends of one-sided 95 % Wilson intervals on the (decayed, prior-weighted) counts."""
        n = self._tested.get(drafter, 0.0) + self.prior_weight
        p = self.alpha(drafter)
        z2 = WILSON_Z**2
        centre = (p + z2 / (2.0 * n)) / (1.0 + z2 / n)
        spread = WILSON_Z * math.sqrt(p * (1.0 - p) / n + z2 / (4.0 * n * n)) / (1.0 + z2 / n)
        return max(centre - spread, 0.0), min(centre + spread, 1.0)

    def _alpha_of(self, drafter: str, accepted: dict[str, float], tested: dict[str, float]) -> float:
        hits = accepted.get(drafter, 0.0) + self.prior_alpha * self.prior_weight
        return hits / (tested.get(drafter, 0.0) + self.prior_weight)

    def evidence(self, drafter: str) -> float:
        """Draft positions tested so far for ``drafter`` (decayed)."""
        return self._tested.get(drafter, 0.0)

    def verify_ms(self, gamma: int) -> float | None:
        """V(γ): measured median for this width, else the cost model's line through the widths."""
        return self.costs.plain_ms if gamma == 0 else self.costs.verify_ms(gamma)

    def widths(self, cap: int) -> range:
        """The γ ≥ 1 worth predicting: up to ``cap``, at most two above the widest pass timed."""
        return range(1, min(cap, self.costs.widest + 2) + 1)

    def speedups(self, drafter: str, cap: int, alpha: float | None = None) -> dict[int, float]:
        """Predicted speed over plain decoding for each allowed γ ≥ 1 (empty until measurable)."""
        model = self.costs.model(drafter)
        if model is None:
            return {}
        alpha = self.alpha(drafter) if alpha is None else alpha
        return model.curve(alpha, self.widths(cap))

    def catch_up_ms_per_token(self, drafter: str) -> float | None:
        """What ``drafter`` pays per token it catches up on: timed, else the reply's estimate
        from the target's prefill, else a share of its drafting cost."""
        timed = self.costs.catch_up_ms(drafter)
        if timed is not None:
            return timed
        if self.read_ms_per_token is not None:
            return self.read_ms_per_token
        per_token = self.costs.draft_ms(drafter)
        return None if per_token is None else self.catch_up_prior * per_token

    def estimates(self, drafter: str, cap: int, gamma: int) -> AdaptiveEstimates:
        widths = range(0, min(cap, self.costs.widest + 2) + 1)
        verify = {g: v for g in widths if (v := self.verify_ms(g)) is not None}
        return AdaptiveEstimates(
            alpha=self.alpha(drafter),
            plain_ms=self.costs.plain_ms,
            draft_ms_per_token=self.costs.draft_ms(drafter),
            verify_ms=verify,
            speedup=self.speedups(drafter, cap),
            gamma=gamma,
        )
