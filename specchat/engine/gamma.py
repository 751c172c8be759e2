"""γ schedules: how many tokens to draft next round.

The engine asks a schedule once per round (``next_gamma``) and reports each finished round
(``observe``), so a key press changing γ between rounds never races the loop.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal, Protocol

from specchat.engine.events import RoundEvent
from specchat.errors import InvalidSettingError

ScheduleName = Literal["fixed", "heuristic"]
SCHEDULES: tuple[ScheduleName, ...] = ("fixed", "heuristic")
GAMMA_MAX = 16


def check_gamma(gamma: int) -> int:
    if not 1 <= gamma <= GAMMA_MAX:
        raise InvalidSettingError(f"gamma must be between 1 and {GAMMA_MAX} (got {gamma}).")
    return gamma


class GammaSchedule(Protocol):
    name: str

    def next_gamma(self) -> int: ...

    def observe(self, event: RoundEvent) -> None: ...


class FixedGamma:
    """γ from a callable, read once per round: the caller may change it at any time."""

    name = "fixed"

    def __init__(self, gamma: int | Callable[[], int]) -> None:
        self._read = gamma if callable(gamma) else (lambda: gamma)

    def next_gamma(self) -> int:
        return self._read()

    def observe(self, event: RoundEvent) -> None:
        pass


class HeuristicGamma:
    """Transformers' assisted-generation rule: +2 after a fully accepted round, −1 otherwise."""

    name = "heuristic"

    def __init__(self, start: int, low: int = 1, high: int = GAMMA_MAX) -> None:
        self.low, self.high = low, high
        self.gamma = min(max(start, low), high)

    def next_gamma(self) -> int:
        return self.gamma

    def observe(self, event: RoundEvent) -> None:
        if event.drafted == 0:
            return
        step = 2 if event.accepted == event.drafted else -1
        self.gamma = min(max(self.gamma + step, self.low), self.high)


def make_schedule(name: str, gamma: int | Callable[[], int]) -> GammaSchedule:
    if name == "fixed":
        return FixedGamma(gamma)
    if name == "heuristic":
        return HeuristicGamma(gamma() if callable(gamma) else gamma)
    raise InvalidSettingError(f"unknown gamma schedule {name!r}: choose one of {', '.join(SCHEDULES)}.")
