"""γ schedules: how many tokens to draft next round.

The engine asks a schedule once per round (``next_gamma``) and reports each finished round
(``observe``), so a key press changing γ between rounds never races the loop. A schedule may
answer 0: the round then drafts nothing and is one plain target step.

- :mod:`~specchat.engine.gamma.base`: the names, what each schedule does with the user's γ,
  the next round's outlook and the protocol;
- :mod:`~specchat.engine.gamma.simple`: the fixed and heuristic schedules;
- the adaptive schedule in three parts: what it has measured
  (:mod:`~specchat.engine.gamma.estimates`), which γ it drafts
  (:mod:`~specchat.engine.gamma.adaptive`, with the catch-up trade in
  :mod:`~specchat.engine.gamma.catch_up`) and how its notes say why
  (:mod:`~specchat.engine.gamma.words`).
"""

from __future__ import annotations

from collections.abc import Callable

from specchat.engine.gamma.adaptive import AdaptiveGamma
from specchat.engine.gamma.base import (
    GAMMA_CHANGE,
    GAMMA_USE,
    NO_OUTLOOK,
    SCHEDULES,
    GammaSchedule,
    RoundOutlook,
    ScheduleName,
    check_gamma,
)
from specchat.engine.gamma.estimates import AdaptiveEstimates, sure_positions
from specchat.engine.gamma.simple import FixedGamma, HeuristicGamma
from specchat.errors import InvalidSettingError

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
    "ScheduleName",
    "check_gamma",
    "make_schedule",
    "sure_positions",
]


def make_schedule(name: str, gamma: int | Callable[[], int]) -> GammaSchedule:
    """The schedule called ``name``, reading the user's γ through ``gamma`` (see GAMMA_USE)."""
    if name == "fixed":
        return FixedGamma(gamma)
    if name == "heuristic":
        return HeuristicGamma(gamma)
    if name == "adaptive":
        return AdaptiveGamma(gamma)
    raise InvalidSettingError(f"unknown gamma schedule {name!r}: choose one of {', '.join(SCHEDULES)}.")
