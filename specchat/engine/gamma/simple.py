"""The schedules that follow the user's γ: fixed, and transformers' heuristic."""

from __future__ import annotations

from collections.abc import Callable

from specchat.engine.events import DrafterName, RoundEvent
from specchat.engine.gamma.base import NO_OUTLOOK, RoundOutlook
from specchat.params import GAMMA_MAX


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
