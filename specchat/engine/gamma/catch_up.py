"""A draft model's catch-up before it drafts: what reading the tokens it is behind on would cost,
against what drafting could win back over the reply (the adaptive schedule weighs one against
the other before a draft that first reads a long way)."""

from __future__ import annotations

from dataclasses import dataclass

from specchat.engine.costs import ROUTINE_CATCH_UP
from specchat.engine.gamma.base import RoundOutlook


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


def catch_up_cost_ms(reads: int, ms_per_token: float | None) -> float:
    """The one-off part of the next draft: reading ``reads`` tokens at ``ms_per_token`` (a
    routine read of one or two tokens is part of drafting, and costs nothing extra)."""
    if reads <= ROUTINE_CATCH_UP:
        return 0.0
    return reads * (ms_per_token or 0.0)


def trade(
    speedup: float,
    outlook: RoundOutlook,
    window: int | None,
    plain_ms: float | None,
    ms_per_token: float | None,
) -> CatchUp:
    """The catch-up of reading all the drafter is behind on (``window`` None) or only the last
    ``window`` tokens, against what drafting at ``speedup`` could save over the horizon."""
    reads = min(outlook.behind, window) if window else outlook.behind
    tokens = horizon(outlook)
    gain = None
    if plain_ms is not None:
        gain = tokens * plain_ms * max(1.0 - 1.0 / speedup, 0.0)
    cost = catch_up_cost_ms(reads, ms_per_token)
    return CatchUp(reads, outlook.behind, cost, gain, tokens, window, speedup)
