"""What a γ changed by a key (F2/F3, the advisor's Ctrl+K: one write to ``Controls.gamma``) does
under each schedule, from the next round. The --gamma help, the key help and docs/chat.md say
the same (GAMMA_USE, GAMMA_CHANGE)."""

from __future__ import annotations

from specchat.engine.backend import Controls
from specchat.engine.events import RoundEvent
from specchat.engine.gamma import (
    GAMMA_CHANGE,
    GAMMA_USE,
    SCHEDULES,
    AdaptiveGamma,
    FixedGamma,
    HeuristicGamma,
    make_schedule,
)
from specchat.engine.session import ChatEngine


class User:
    """The user's γ as the engine reads it: a callable over a value a key press rewrites."""

    def __init__(self, gamma: int) -> None:
        self.gamma = gamma

    def __call__(self) -> int:
        return self.gamma


def drafted(n: int, gamma: int, accepted: int, *, d: float = 10.0, verify: float = 105.0) -> RoundEvent:
    return RoundEvent(n, gamma, gamma, accepted, d * gamma, verify, "model")


def plain(n: int, ms: float = 100.0) -> RoundEvent:
    return RoundEvent(n, 0, 0, 0, 0.0, ms, "model")


def test_every_schedule_says_what_a_changed_gamma_does() -> None:
    assert set(GAMMA_USE) == set(GAMMA_CHANGE) == set(SCHEDULES)
    assert all(text.startswith(name) for name, text in GAMMA_USE.items())


def test_fixed_drafts_a_changed_gamma_from_the_next_round() -> None:
    user = User(3)
    schedule = make_schedule("fixed", user)
    assert isinstance(schedule, FixedGamma) and schedule.next_gamma() == 3
    user.gamma = 7
    assert schedule.next_gamma() == 7


def test_heuristic_restarts_from_a_changed_gamma_at_the_next_round() -> None:
    user = User(3)
    schedule = make_schedule("heuristic", user)
    assert isinstance(schedule, HeuristicGamma)
    assert schedule.next_gamma() == 3
    schedule.observe(drafted(0, 3, 3))  # fully accepted: +2
    assert schedule.next_gamma() == 5
    user.gamma = 2  # a key press between rounds
    assert schedule.next_gamma() == 2  # the rule starts again from the user's γ
    schedule.observe(drafted(1, 2, 2))
    assert schedule.next_gamma() == 4  # and moves on from it, + 2 / − 1 as before
    schedule.observe(drafted(2, 4, 1))
    assert schedule.next_gamma() == 3


def test_heuristic_keeps_what_it_reached_while_the_users_gamma_stays() -> None:
    user = User(3)
    schedule = make_schedule("heuristic", user)
    schedule.next_gamma()
    schedule.observe(drafted(0, 3, 3))
    schedule.begin_reply(user)  # the next reply, γ untouched: the γ reached carries over
    assert schedule.next_gamma() == 5
    user.gamma = 5
    user.gamma = 3  # changed and changed back before a round read it: nothing to restart
    assert schedule.next_gamma() == 5
    schedule.begin_reply(User(9))  # changed between replies: the next reply starts there
    assert schedule.next_gamma() == 9


def test_heuristic_in_the_engine_follows_a_key_from_the_next_round(engine: ChatEngine) -> None:
    controls = Controls(gamma=2, schedule="heuristic", max_new_tokens=200)
    prompt = engine.prompt_ids([{"role": "user", "content": "count with me: one two three"}])
    rounds: list[RoundEvent] = []
    for event in engine.stream_ids(prompt, controls):
        if isinstance(event, RoundEvent):
            rounds.append(event)
            if event.round == 2:
                controls.gamma = 9  # as F3 or Ctrl+K would, mid-reply
            if len(rounds) == 4:
                break
    assert rounds[0].gamma == 2
    assert rounds[3].gamma == 9  # the round after the key press restarts from the new γ


def measured_adaptive(user: User) -> AdaptiveGamma:
    """An adaptive schedule that has timed plain steps and the model drafter's cost."""
    schedule = AdaptiveGamma(user)
    for n in range(3):
        schedule.next_gamma()
        schedule.observe(plain(n))
    for n in range(3, 12):
        gamma = schedule.next_gamma()
        schedule.observe(drafted(n, gamma, gamma) if gamma else plain(n))
    assert schedule.estimates().c is not None
    return schedule


def test_adaptive_drafts_a_changed_gamma_only_before_it_has_timed_the_drafter() -> None:
    user = User(1)
    schedule = AdaptiveGamma(user)
    for n in range(3):  # the yardstick: plain steps, whatever γ says
        assert schedule.next_gamma() == 0
        schedule.observe(plain(n))
    user.gamma = 2  # a key press before the first draft: that draft follows it
    assert schedule.next_gamma() == 2
    user.gamma = 9
    assert schedule.next_gamma() == 3  # at most 3 for a first draft

    one, other = User(1), User(1)
    first, second = measured_adaptive(one), measured_adaptive(other)
    other.gamma = 12  # once measured, the schedule picks γ itself: a changed γ does not move it
    assert first.next_gamma() == second.next_gamma() and first.note == second.note
