"""The seed formula and the cost model: what a round is expected to yield and to cost.

:func:`expected_tokens_per_round` and :func:`predicted_speedup` are the seed formula;
:class:`CostEstimator` turns rounds' own timings into c and v(γ) (:class:`CostModel`), and
:func:`interpolate_verify_ms` is the one place a verify pass's cost is predicted for a width not
yet measured. The adaptive γ schedule, the theory panel and the bench all read it (through
:mod:`specchat.engine.metrics`, which re-exports it), so the same rounds give them the same
figures. Pure Python (no torch).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from statistics import median

from specchat.engine.events import Event, RoundEvent, known


def expected_tokens_per_round(alpha: float, gamma: int) -> float:
    """E[T] = (1 − α^(γ+1)) / (1 − α): accepted drafts plus the one closing token."""
    if gamma <= 0:
        return 1.0
    if alpha >= 1.0:
        return float(gamma + 1)
    return (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)


def predicted_speedup(alpha: float, gamma: int, cost_ratio: float, verify_ratio: float = 1.0) -> float:
    """Speedup over plain decoding: E[T] / (γ·c + v(γ)).

    ``cost_ratio`` is c, one draft pass over one target pass; ``verify_ratio`` is v(γ), one
    target pass over γ+1 positions relative to a single-position pass (1 when memory-bound).
    """
    if gamma <= 0:
        return 1.0
    return expected_tokens_per_round(alpha, gamma) / (gamma * cost_ratio + verify_ratio)


def monotone_fit(values: Mapping[int, float], weights: Mapping[int, float]) -> dict[int, float]:
    """The non-decreasing sequence (in key order) closest to ``values`` in weighted least squares.

    Pool adjacent violators: walking up the keys, any value below the block before it is merged
    with that block into their weighted mean, until the blocks rise. A point with more samples
    pulls harder, so a lone slow timing gives way to its well-measured neighbours. (Twenty lines
    here rather than scikit-learn or SciPy for the one call.)
    """
    blocks: list[tuple[list[int], float, float]] = []  # (keys, weighted mean, total weight)
    for key in sorted(values):
        keys, mean, weight = [key], values[key], max(weights.get(key, 1.0), 1e-9)
        while blocks and blocks[-1][1] > mean:
            previous_keys, previous_mean, previous_weight = blocks.pop()
            total = previous_weight + weight
            mean = (previous_mean * previous_weight + mean * weight) / total
            keys, weight = previous_keys + keys, total
        blocks.append((keys, mean, weight))
    return {key: mean for keys, mean, _ in blocks for key in keys}


def interpolate_verify_ms(measured: Mapping[int, float], gamma: int) -> float | None:
    """V(γ), milliseconds of a target pass over γ+1 positions, from the widths measured so far.

    ``measured`` maps γ to milliseconds (γ = 0 is one plain step). A measured width is its own
    value; any other lies on the least-squares line through the measured points, its slope
    clamped at zero (a wider pass never costs less) and never below the plain step. One point
    gives a flat line. This is the only interpolation of v(γ) in specchat.
    """
    if gamma in measured:
        return measured[gamma]
    points = sorted(measured.items())
    if not points:
        return None
    floor = measured.get(0, 0.0)
    if len(points) == 1:
        return max(points[0][1], floor)
    mean_k = sum(k for k, _ in points) / len(points)
    mean_v = sum(v for _, v in points) / len(points)
    spread = sum((k - mean_k) ** 2 for k, _ in points)
    slope = max(sum((k - mean_k) * (v - mean_v) for k, v in points) / spread, 0.0)
    return max(mean_v + slope * (gamma - mean_k), floor)


@dataclass(frozen=True, slots=True)
class CostModel:
    """What a round costs, in milliseconds measured on this machine, and the seed formula on it.

    A round drafting γ tokens costs γ·d + V(γ); plain decoding costs V(0) per token. Over V(0)
    that is γ·c + v(γ), and the predicted speed-up is E[T](α, γ) / (γ·c + v(γ)).
    """

    plain_ms: float
    """V(0): one plain target step."""
    draft_ms: float
    """d: drafting one token."""
    verify_ms: Mapping[int, float] = field(default_factory=dict)
    """Measured V(γ) for the widths seen (γ ≥ 1)."""
    _interpolated: dict[int, float] = field(default_factory=dict, compare=False, repr=False)
    """V(γ) once computed: a schedule asks for each width several times a round."""

    @property
    def c(self) -> float:
        return self.draft_ms / self.plain_ms

    def verify(self, gamma: int) -> float:
        """V(γ) in milliseconds, interpolated where not measured."""
        found = self._interpolated.get(gamma)
        if found is None:
            found = interpolate_verify_ms({0: self.plain_ms, **self.verify_ms}, gamma)
            assert found is not None  # the plain step is always a point
            self._interpolated[gamma] = found
        return found

    def v(self, gamma: int) -> float:
        """v(γ) = V(γ) / V(0)."""
        return 1.0 if gamma <= 0 else self.verify(gamma) / self.plain_ms

    def is_measured(self, gamma: int) -> bool:
        return gamma == 0 or gamma in self.verify_ms

    def speedup(self, alpha: float, gamma: int) -> float:
        """Predicted speed over plain decoding: E[T](α, γ) / (γ·c + v(γ))."""
        return predicted_speedup(alpha, gamma, self.c, self.v(gamma))

    def curve(self, alpha: float, gammas: Iterable[int]) -> dict[int, float]:
        return {g: self.speedup(alpha, g) for g in gammas}

    def best_gamma(self, alpha: float, gammas: Sequence[int]) -> int:
        """The γ of ``gammas`` with the highest predicted speed-up (the smallest on a tie)."""
        curve = self.curve(alpha, gammas)
        return max(gammas, key=lambda g: (curve[g], -g))


class RecentMedian:
    """The median of the last few samples: robust to a stray slow round (another process, a GC)."""

    def __init__(self, size: int = 9) -> None:
        self._values: deque[float] = deque(maxlen=size)

    def add(self, value: float) -> None:
        self._values.append(value)

    def __len__(self) -> int:
        return len(self._values)

    @property
    def value(self) -> float | None:
        return median(self._values) if self._values else None


ROUTINE_CATCH_UP = 2
"""Tokens a draft model reads at the start of every drafted round after a drafted round: the
round's closing token, and after a fully accepted round also the last draft. Part of d; more
than this is a catch-up (the prompt at a reply's first draft, the tokens of plain rounds)."""


def draft_prefill_ms(rounds: Iterable[RoundEvent]) -> float | None:
    """Milliseconds one reply's draft model spent catching up (its prefill), from its rounds.

    A round whose drafter read more than :data:`ROUTINE_CATCH_UP` tokens before drafting
    (RoundEvent.caught_up) paid a catch-up inside its ``draft_ms``: estimated as
    max(0, draft_ms − drafted·d), d the median draft_ms/drafted of the same reply's routine rounds
    of that drafter (caught_up ≤ ROUTINE_CATCH_UP, drafted > 0); with no routine round to take
    d from, the whole draft_ms. The reply's own rounds, not :class:`CostEstimator`'s recent
    window: this is what one reply paid, for the bench to add up. 0.0 when no round caught up;
    None when a catch-up round was not timed (a server).
    """
    rounds = list(rounds)
    per_token: dict[str, list[float]] = {}
    for event in rounds:
        if event.caught_up <= ROUTINE_CATCH_UP and event.drafted > 0 and known(event.draft_ms):
            per_token.setdefault(event.drafter, []).append(event.draft_ms / event.drafted)
    total = 0.0
    for event in rounds:
        if event.caught_up <= ROUTINE_CATCH_UP:
            continue
        if not known(event.draft_ms):
            return None
        routine = per_token.get(event.drafter)
        drafting = event.drafted * median(routine) if routine else 0.0
        total += max(0.0, event.draft_ms - drafting)
    return total


FASTER_NOW = 0.8
"""A pass this much faster than its width's median means the machine changed (another job
ended): interference only ever slows a pass, so the old timings go rather than outvote it."""


def _much_faster(ms: float, timings: RecentMedian | None) -> bool:
    median_ms = timings.value if timings is not None else None
    return median_ms is not None and ms < FASTER_NOW * median_ms


class CostEstimator:
    """c and v(γ) measured live from RoundEvents' own timings (recent rounds' medians).

    Plain rounds (nothing drafted) time V(0); drafted rounds time V(γ) by the width they
    verified and d per drafter ("model", "ngram": a lookup costs next to nothing). Rounds without
    timings (a server) are ignored. A round whose draft model first caught up on more than
    :data:`ROUTINE_CATCH_UP` tokens (RoundEvent.caught_up) paid a one-off prefill besides its
    drafting: it is not taken as d but as a sample of what catching up costs per token
    (:meth:`catch_up_ms`).

    A wider pass never costs less, so the widths' medians are read through their closest
    non-decreasing fit (:func:`monotone_fit`, each width weighted by its samples): one slow pass
    timed at a width the schedule then stopped choosing would otherwise stand for that width
    forever. :meth:`needs_refresh` says which widths rest on too little, or too old, evidence,
    and a pass much faster than its width's median replaces the old timings (:data:`FASTER_NOW`).
    """

    def __init__(self, window: int = 9, *, min_samples: int = 3, stale_after: int = 64) -> None:
        self.window = window
        self.min_samples = min_samples
        self.stale_after = stale_after
        self.plain = RecentMedian(window)
        self.verify: dict[int, RecentMedian] = {}
        self.draft_per_token: dict[str, RecentMedian] = {}
        self._catch_ups: dict[str, deque[tuple[float, int, int]]] = {}
        """Drafter → recent catch-up rounds as (draft_ms, drafted, caught_up)."""
        self._rounds = 0
        self._last_timed: dict[int, int] = {}
        """Width → the round (counted by this estimator) in which it was last timed."""
        self._fitted: dict[int, float] | None = None
        self._models: dict[str, CostModel | None] = {}
        """What the timings give until the next round changes them (read many times a round)."""

    def observe(self, event: RoundEvent) -> None:
        if not known(event.verify_ms) or not known(event.draft_ms):
            return
        self._fitted = None
        self._models.clear()
        self._rounds += 1
        # Timings from so long ago that the machine may have changed since (the first, cold
        # passes; another load) go: one fresh pass could never move a median of many old ones.
        stale = event.drafted in self._last_timed and self._timed_long_ago(event.drafted)
        self._last_timed[event.drafted] = self._rounds
        if event.drafted == 0:
            step = event.verify_ms + event.draft_ms  # a failed lookup is part of the step
            if stale or _much_faster(step, self.plain):
                self.plain = RecentMedian(self.window)
            self.plain.add(step)
            return
        if stale or _much_faster(event.verify_ms, self.verify.get(event.drafted)):
            self.verify.pop(event.drafted, None)
        self._forget_narrower_than(event.drafted, event.verify_ms)
        self.verify.setdefault(event.drafted, RecentMedian(self.window)).add(event.verify_ms)
        if event.caught_up > ROUTINE_CATCH_UP:
            rounds = self._catch_ups.setdefault(event.drafter, deque(maxlen=self.window))
            rounds.append((event.draft_ms, event.drafted, event.caught_up))
            return
        per_token = self.draft_per_token.setdefault(event.drafter, RecentMedian(self.window))
        per_token.add(event.draft_ms / event.drafted)

    def _forget_narrower_than(self, width: int, ms: float) -> None:
        """A narrower pass never costs more than a wider one: narrower widths whose timings are
        much slower than this pass were timed on a busier machine, and go (the plain step too)."""
        for narrower in [w for w in self.verify if w < width]:
            if _much_faster(ms, self.verify[narrower]):
                del self.verify[narrower]
        if _much_faster(ms, self.plain):
            self.plain = RecentMedian(self.window)

    def extend(self, events: Iterable[Event]) -> None:
        for event in events:
            if isinstance(event, RoundEvent):
                self.observe(event)

    @property
    def plain_ms(self) -> float | None:
        """V(0), one plain step, as fitted with the wider passes (None until one was timed)."""
        return self.verify_fitted().get(0)

    def draft_ms(self, drafter: str) -> float | None:
        found = self.draft_per_token.get(drafter)
        return found.value if found is not None else None

    def catch_up_ms(self, drafter: str) -> float | None:
        """Milliseconds per token the drafter paid to catch up, beyond its drafting, over its
        recent catch-up rounds (with d as known now); None until both were timed. Weighted by
        the tokens read: the schedule prices long reads with it, whose per-token cost a few
        three-token catch-ups (mostly the pass's fixed cost) would otherwise outvote."""
        per_token, rounds = self.draft_ms(drafter), self._catch_ups.get(drafter)
        if per_token is None or not rounds:
            return None
        extra = sum(max(ms - drafted * per_token, 0.0) for ms, drafted, _ in rounds)
        return extra / sum(caught for _, _, caught in rounds)

    def _timings(self) -> dict[int, RecentMedian]:
        timings = dict(self.verify)
        if len(self.plain):
            timings[0] = self.plain
        return dict(sorted(timings.items()))

    def verify_measured(self) -> dict[int, float]:
        """Median V(γ) of each width seen, γ = 0 (the plain step) included when seen."""
        return {g: v for g, r in self._timings().items() if (v := r.value) is not None}

    def verify_fitted(self) -> dict[int, float]:
        """The measured widths' V(γ), made non-decreasing in γ (see :func:`monotone_fit`)."""
        if self._fitted is None:
            weights = {g: float(len(r)) for g, r in self._timings().items()}
            self._fitted = monotone_fit(self.verify_measured(), weights)
        return dict(self._fitted)

    def verify_ms(self, gamma: int) -> float | None:
        return interpolate_verify_ms(self.verify_fitted(), gamma)

    def needs_refresh(self, gamma: int) -> bool:
        """Whether width ``gamma`` was timed fewer than ``min_samples`` times, or not for
        ``stale_after`` rounds: worth timing again before the schedule rules it out."""
        timings = self._timings().get(gamma)
        if timings is None or len(timings) < self.min_samples:
            return True
        return self._timed_long_ago(gamma)

    def _timed_long_ago(self, gamma: int) -> bool:
        return self._rounds - self._last_timed.get(gamma, 0) > self.stale_after

    @property
    def widest(self) -> int:
        return max(self.verify, default=0)

    def model(self, drafter: str) -> CostModel | None:
        """The cost model for rounds ``drafter`` proposes; None until a plain step and a draft
        by that drafter were both timed."""
        if drafter not in self._models:
            self._models[drafter] = self._model(drafter)
        return self._models[drafter]

    def _model(self, drafter: str) -> CostModel | None:
        fitted = self.verify_fitted()
        plain, draft = fitted.get(0), self.draft_ms(drafter)
        if plain is None or draft is None or plain <= 0:
            return None
        return CostModel(plain, draft, {g: v for g, v in fitted.items() if g > 0})
