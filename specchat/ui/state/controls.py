"""The chat's control keys, as pure functions: γ up and down, the γ schedule, the drafter and
the temperature, and whether a server lets them change.

Each takes the value in force and returns the next one; the app writes it to the engine's
``Controls`` in one attribute write (the engine reads them once per round, so a key press never
races the loop). Nothing here needs Textual, so the rules are tested without an app.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal

from specchat.engine.gamma import GAMMA_MAX, SCHEDULES, ScheduleName

if TYPE_CHECKING:
    from specchat.backend import Capabilities

TEMPERATURE_STEP = 0.1
TEMPERATURE_MAX = 2.0

Control = Literal["gamma", "schedule", "drafter"]
CONTROL_NAMES: dict[Control, str] = {"gamma": "γ", "schedule": "the γ schedule", "drafter": "the drafter"}


def stepped_gamma(gamma: int, step: int) -> int:
    """γ moved by ``step``, kept within 1..GAMMA_MAX (γ 0 would draft nothing)."""
    return max(1, min(GAMMA_MAX, gamma + step))


def next_schedule(current: str) -> ScheduleName:
    """The schedule after ``current``, round the list; the first for an unknown one."""
    names = list(SCHEDULES)
    return names[(names.index(current) + 1) % len(names) if current in names else 0]


def next_drafter(current: str, available: Sequence[str]) -> str:
    """The drafter after ``current`` among those available, round the list."""
    names = list(available)
    index = names.index(current) if current in names else -1
    return names[(index + 1) % len(names)]


def stepped_temperature(temperature: float, step: float) -> float:
    """The temperature moved by ``step`` within 0..TEMPERATURE_MAX, rounded so that ten steps
    up and ten down come back to where they started."""
    return round(max(0.0, min(TEMPERATURE_MAX, temperature + step)), 2)


def server_refusal(caps: Capabilities, control: Control) -> str | None:
    """Why ``control`` cannot change (a server fixed it when it started), or None when it can."""
    if control == "gamma" and caps.gamma_control in ("per-round", "per-request"):
        return None
    if control != "gamma" and (caps.kind == "local" or caps.drafters):
        return None
    return f"The server fixed {CONTROL_NAMES[control]} when it started: it cannot be changed from here."
