"""What every γ schedule shares: the names, the user's γ and what each schedule does with it,
what the next round faces (:class:`RoundOutlook`) and the schedule protocol."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol

from specchat.engine.events import DrafterName, RoundEvent
from specchat.errors import InvalidSettingError
from specchat.params import DRAFT_STOP_BELOW, GAMMA_MAX

ScheduleName = Literal["fixed", "heuristic", "adaptive"]
SCHEDULES: tuple[ScheduleName, ...] = ("fixed", "heuristic", "adaptive")
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
