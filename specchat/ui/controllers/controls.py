"""The chat's control keys, as pure functions: γ up and down, the γ schedule, the drafter and
the temperature, and whether a server lets them change.

Each rule takes the value in force and returns the next one; :class:`ControlKeys` applies them
to the leased models' ``Controls`` in one attribute write (the engine reads them once per round,
so a key press never races the loop), and the screens' key actions only call it. The rules need
no Textual, so they are tested without an app.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any, Literal, Protocol

from specchat.engine.gamma import SCHEDULES, ScheduleName
from specchat.params import GAMMA_MAX
from specchat.ui.state.live import ControlsView
from specchat.ui.talk.rules import apply_best_gamma

if TYPE_CHECKING:
    from specchat.engine.backend import Capabilities, Controls
    from specchat.ui.state.commands import Commands
    from specchat.ui.talk.theory_tracker import TheoryTracker

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


class Leased(Protocol):
    """What the keys need of the model lease: the backend and its controls (None while loading)."""

    @property
    def backend(self) -> Any | None: ...

    @property
    def controls(self) -> Controls | None: ...

    @property
    def capabilities(self) -> Capabilities | None: ...


class ControlKeys:
    """The γ, schedule, drafter and temperature keys on the controls of the models in force.

    Each key does nothing while the models load; a control a server fixed is refused with a
    notice. After a change ``changed`` redraws the panels.
    """

    def __init__(
        self, lease: Leased, notify: Callable[[str, str], object], changed: Callable[[], object]
    ) -> None:
        self.lease = lease
        self.notify = notify
        self.changed = changed

    def _allowed(self, control: Control) -> Controls | None:
        """The controls to change, or None (loading, or a server fixed ``control``: said so)."""
        controls, caps = self.lease.controls, self.lease.capabilities
        if controls is None or caps is None:
            return None
        refusal = server_refusal(caps, control)
        if refusal is not None:
            self.notify(refusal, "")
            return None
        return controls

    def add_commands(self, table: Commands, tracker: TheoryTracker) -> None:
        """The control keys' commands (the race and self-test screens run them too), and the
        advisor's best γ for what ``tracker`` measured."""
        table.add("gamma_up", partial(self.step_gamma, +1))
        table.add("gamma_down", partial(self.step_gamma, -1))
        table.add("cycle_schedule", self.cycle_schedule)
        table.add("cycle_drafter", self.cycle_drafter)
        table.add("temperature_up", partial(self.step_temperature, +TEMPERATURE_STEP))
        table.add("temperature_down", partial(self.step_temperature, -TEMPERATURE_STEP))
        table.add("best_gamma", partial(self.best_gamma, tracker))

    def step_gamma(self, step: int) -> None:
        if (controls := self._allowed("gamma")) is not None:
            controls.gamma = stepped_gamma(controls.gamma, step)
            self.changed()

    def cycle_schedule(self) -> None:
        if (controls := self._allowed("schedule")) is not None:
            controls.schedule = next_schedule(controls.schedule)
            self.changed()

    def cycle_drafter(self) -> None:
        if (controls := self._allowed("drafter")) is not None:
            controls.drafter = next_drafter(controls.drafter, self._drafters())
            self.changed()

    def step_temperature(self, step: float) -> None:
        controls = self.lease.controls
        if controls is not None:
            controls.temperature = stepped_temperature(controls.temperature, step)
            self.changed()

    def best_gamma(self, tracker: TheoryTracker) -> None:
        """Set γ to the advisor's best for what this session measured, and say what it predicts."""
        controls = self.lease.controls
        if controls is not None:
            note, title = apply_best_gamma(tracker, controls)
            self.notify(note, title)
            if title:
                self.changed()

    def view(self) -> ControlsView | None:
        """The controls in force as the panels show them (a server's capabilities alongside)."""
        c, caps = self.lease.controls, self.lease.capabilities
        if c is None or caps is None:
            return None
        server = None if caps.kind == "local" else caps
        return ControlsView(c.gamma, c.schedule, c.drafter, c.temperature, self._drafters(), server)

    def _drafters(self) -> tuple[str, ...]:
        backend = self.lease.backend
        return tuple(backend.available_drafters) if backend is not None else ()
