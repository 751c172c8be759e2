"""The control keys' rules and the keys that apply them, without an app: γ bounds, the cycles,
temperature steps, servers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specchat.engine.backend import Capabilities, Controls
from specchat.engine.gamma import SCHEDULES
from specchat.params import GAMMA_MAX
from specchat.ui.controllers.controls import (
    TEMPERATURE_MAX,
    TEMPERATURE_STEP,
    ControlKeys,
    next_drafter,
    next_schedule,
    server_refusal,
    stepped_gamma,
    stepped_temperature,
)
from specchat.ui.state.live import ControlsView


def test_gamma_stays_within_one_and_its_maximum() -> None:
    assert stepped_gamma(4, +1) == 5
    assert stepped_gamma(1, -1) == 1
    assert stepped_gamma(GAMMA_MAX, +1) == GAMMA_MAX


def test_the_schedule_cycles_through_all_and_starts_over() -> None:
    seen = ["fixed"]
    for _ in SCHEDULES:
        seen.append(next_schedule(seen[-1]))
    assert seen[: len(SCHEDULES)] == list(SCHEDULES) and seen[-1] == seen[0]
    assert next_schedule("unknown") == SCHEDULES[0]


def test_the_drafter_cycles_through_those_available() -> None:
    assert next_drafter("model", ["none", "model", "ngram"]) == "ngram"
    assert next_drafter("ngram", ["none", "model", "ngram"]) == "none"
    assert next_drafter("gone", ["none", "model"]) == "none"


def test_temperature_steps_stay_in_range_and_come_back_exactly() -> None:
    t = 0.7
    for _ in range(10):
        t = stepped_temperature(t, +TEMPERATURE_STEP)
    for _ in range(10):
        t = stepped_temperature(t, -TEMPERATURE_STEP)
    assert t == 0.7
    assert stepped_temperature(0.0, -TEMPERATURE_STEP) == 0.0
    assert stepped_temperature(TEMPERATURE_MAX, +TEMPERATURE_STEP) == TEMPERATURE_MAX


def test_a_server_that_fixed_its_controls_says_so() -> None:
    local = Capabilities(kind="local", provenance="exact", measured=frozenset())
    assert server_refusal(local, "gamma") is None and server_refusal(local, "drafter") is None
    fixed = Capabilities(
        kind="llama-server", provenance="inferred", measured=frozenset(), gamma_control="fixed"
    )
    assert server_refusal(fixed, "gamma") == (
        "The server fixed γ when it started: it cannot be changed from here."
    )
    assert "the drafter" in (server_refusal(fixed, "drafter") or "")
    switchable = Capabilities(kind="vllm", provenance="inferred", measured=frozenset(), drafters=("a", "b"))
    assert server_refusal(switchable, "schedule") is None


@dataclass
class _Lease:
    backend: Any | None = None
    controls: Controls | None = None
    capabilities: Capabilities | None = None


@dataclass
class _Engine:
    available_drafters: tuple[str, ...] = ("model", "ngram")


def test_the_keys_apply_the_rules_to_the_leased_controls() -> None:
    notes: list[tuple[str, str]] = []
    changes: list[int] = []
    lease = _Lease()
    keys = ControlKeys(lease, lambda note, title: notes.append((note, title)), lambda: changes.append(1))
    keys.step_gamma(+1)
    keys.cycle_drafter()
    assert keys.view() is None and not changes, "nothing to change while the models load"

    local = Capabilities(kind="local", provenance="exact", measured=frozenset())
    lease.backend, lease.controls, lease.capabilities = _Engine(), Controls(gamma=4), local
    keys.step_gamma(+1)
    keys.cycle_drafter()
    keys.step_temperature(+TEMPERATURE_STEP)
    assert (lease.controls.gamma, lease.controls.drafter, lease.controls.temperature) == (5, "ngram", 0.1)
    assert len(changes) == 3 and not notes
    assert keys.view() == ControlsView(5, "fixed", "ngram", 0.1, ("model", "ngram"))

    fixed = Capabilities(
        kind="llama-server", provenance="inferred", measured=frozenset(), gamma_control="fixed"
    )
    lease.capabilities = fixed
    keys.step_gamma(+1)
    assert lease.controls.gamma == 5 and len(changes) == 3
    assert notes == [("The server fixed γ when it started: it cannot be changed from here.", "")]
    view = keys.view()
    assert view is not None and view.server is fixed
