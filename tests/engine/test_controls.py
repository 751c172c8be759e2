"""Controls change between rounds; cancellation from another thread keeps what was generated."""

from __future__ import annotations

import itertools
import threading

from specchat.engine.backend import Controls
from specchat.engine.events import RoundEvent, SummaryEvent, TokenEvent
from specchat.engine.session import ChatEngine


def prompt(engine: ChatEngine) -> list[int]:
    return engine.prompt_ids([{"role": "user", "content": "count with me: one two three"}])


def test_gamma_is_read_once_per_round(engine: ChatEngine) -> None:
    controls = Controls(gamma=2, max_new_tokens=60)
    gammas, budget_left, generated = [], [], 0
    for event in engine.stream_ids(prompt(engine), controls):
        if isinstance(event, TokenEvent):
            generated += 1
        if isinstance(event, RoundEvent):
            gammas.append(event.gamma)
            if event.round == 2:
                controls.gamma = 5  # as a key press would, mid-reply
            budget_left.append(controls.max_new_tokens - generated)
    assert gammas[:3] == [2, 2, 2]
    # From the next round on γ is 5, except that no round drafts past the token budget.
    assert gammas[3:] == [min(5, left - 1) for left in budget_left[2:-1]]


def test_drafter_and_temperature_switch_mid_reply(engine: ChatEngine) -> None:
    controls = Controls(gamma=3, drafter="none", max_new_tokens=40, seed=0)
    drafters = []
    for event in engine.stream_ids(prompt(engine), controls):
        if isinstance(event, RoundEvent):
            drafters.append(event.drafter)
            if event.round == 3:
                controls.drafter, controls.temperature = "model", 0.8
            if event.round == 8:
                controls.drafter = "ngram"
    assert drafters[:4] == ["none"] * 4
    assert drafters[4] == "model"
    assert drafters[9] == "ngram"


def test_heuristic_schedule_moves_gamma_within_bounds(engine: ChatEngine) -> None:
    controls = Controls(gamma=3, schedule="heuristic", max_new_tokens=80)
    rounds = [e for e in engine.stream_ids(prompt(engine), controls) if isinstance(e, RoundEvent)]
    for before, after in itertools.pairwise(rounds):
        if after.gamma == 0 or before.drafted == 0 or after.gamma < before.gamma - 1:
            continue  # the budget clamp near max_new_tokens
        expected = before.gamma + (2 if before.accepted == before.drafted else -1)
        assert after.gamma == max(1, min(16, expected))


def test_cancel_from_another_thread_stops_within_a_round(engine: ChatEngine) -> None:
    cancel = threading.Event()
    controls = Controls(gamma=3, max_new_tokens=200)
    seen_rounds = 0
    events = []
    for event in engine.stream_ids(prompt(engine), controls, cancel):
        events.append(event)
        if isinstance(event, RoundEvent):
            seen_rounds += 1
            if seen_rounds == 3:
                threading.Thread(target=cancel.set).start()
                threading.Event().wait(0.05)  # let the other thread run before the next round
    summary = events[-1]
    assert isinstance(summary, SummaryEvent)
    assert summary.stop == "cancelled"
    assert summary.rounds == 3
    assert summary.tokens == sum(isinstance(e, TokenEvent) for e in events) > 0
