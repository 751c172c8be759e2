"""The adaptive γ schedule, driven by synthetic rounds: it drafts where drafting pays, never otherwise."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest

from specchat.engine.backend import Controls
from specchat.engine.events import RoundEvent, TokenEvent
from specchat.engine.gamma import SCHEDULES, AdaptiveGamma, make_schedule, sure_positions
from specchat.engine.metrics import positions_tested
from specchat.engine.session import ChatEngine
from specchat.testing.tiny_models import TinyPair


def plain_round(n: int, ms: float = 100.0) -> RoundEvent:
    return RoundEvent(n, 0, 0, 0, 0.0, ms, "model")


def yardstick(schedule: AdaptiveGamma, ms: float = 100.0) -> None:
    """Three plain steps: what the schedule times before anything else (see its first rounds)."""
    for n in range(3):
        schedule.observe(plain_round(n, ms))


def drafted_round(
    n: int, gamma: int, accepted: int, *, draft_ms_per_token: float, verify_ms: float, drafter: str = "model"
) -> RoundEvent:
    return RoundEvent(n, gamma, gamma, accepted, draft_ms_per_token * gamma, verify_ms, drafter)


def drive(
    schedule: AdaptiveGamma,
    rounds: int,
    *,
    plain_ms: float,
    draft_ms_per_token: float,
    verify: dict[int, float] | float,
    accept: float,
) -> list[int]:
    """Ask for γ, play the round with the given costs (acceptance deterministic), report it back."""
    chosen: list[int] = []
    credit = 0.0
    for n in range(rounds):
        gamma = schedule.next_gamma()
        chosen.append(gamma)
        if gamma == 0:
            schedule.observe(plain_round(n, plain_ms))
            continue
        accepted = 0
        for _ in range(gamma):  # each position passes with probability `accept`, deterministically
            credit += accept
            if credit < 1.0:
                break
            credit -= 1.0
            accepted += 1
        verify_ms = verify if isinstance(verify, float) else verify.get(gamma, max(verify.values()))
        schedule.observe(
            drafted_round(n, gamma, accepted, draft_ms_per_token=draft_ms_per_token, verify_ms=verify_ms)
        )
    return chosen


def test_registered_and_built_by_name() -> None:
    assert SCHEDULES == ("fixed", "heuristic", "adaptive")
    schedule = make_schedule("adaptive", lambda: 3)
    assert isinstance(schedule, AdaptiveGamma) and schedule.name == "adaptive"


def test_first_rounds_are_plain_then_the_users_gamma() -> None:
    schedule = AdaptiveGamma(lambda: 2)
    for n in range(3):  # the yardstick, timed like any width: three samples
        assert schedule.next_gamma() == 0 and "timing plain steps" in schedule.note
        schedule.observe(plain_round(n))
    assert schedule.next_gamma() == 2


def test_one_unlucky_round_does_not_switch_speculation_off() -> None:
    schedule = AdaptiveGamma(3)
    for n in range(3):
        schedule.observe(plain_round(n))
    schedule.next_gamma()
    schedule.observe(drafted_round(3, 3, 0, draft_ms_per_token=30.0, verify_ms=105.0))
    assert schedule.next_gamma() > 0  # α is still unknown and the costs leave room


def test_turns_speculation_off_when_it_cannot_pay() -> None:
    # c ≈ 0.6 and a verify pass costing 1.9 plain steps (fp32 on this CPU), acceptance 0.5.
    schedule = AdaptiveGamma(4)
    chosen = drive(schedule, 40, plain_ms=100.0, draft_ms_per_token=60.0, verify=190.0, accept=0.5)
    assert chosen[:3] == [0, 0, 0] and chosen[3] == 3  # the user's γ, at most 3 for the first try
    assert chosen[20:].count(0) == 20  # off once α is known to be too low for these costs
    assert chosen[-10:].count(0) >= 9  # off, apart from an occasional probe
    estimates = schedule.estimates()
    assert estimates.c == pytest.approx(0.6)
    assert all(s < 1.0 for s in estimates.speedup.values())


def test_probes_cost_at_most_their_share_of_plain_decoding() -> None:
    schedule = AdaptiveGamma(2, probe_first=4, probe_share=0.05)
    chosen = drive(schedule, 250, plain_ms=100.0, draft_ms_per_token=80.0, verify=190.0, accept=0.2)
    probes = [i for i, g in enumerate(chosen) if g > 0 and i > 1 and chosen[i - 1] == 0]
    assert len(probes) >= 3, "probes keep refreshing α and the costs while drafting is off"
    later = probes[1:]  # after the first: by then drafting was already known not to pay
    extra = sum(chosen[i] * 80.0 + 190.0 - 100.0 for i in later)
    plain_time = 100.0 * sum(1 for g in chosen[probes[0] :] if g == 0)
    assert extra <= 0.05 * plain_time + 250.0, (extra, plain_time)
    assert min(b - a for a, b in itertools.pairwise(probes)) >= 4


def test_drafts_when_it_pays_and_grows_gamma_with_acceptance() -> None:
    # A cheap draft (c = 0.05) and a nearly flat verify pass: drafting pays, more so at higher γ.
    schedule = AdaptiveGamma(2)
    verify = {g: 100.0 + 3.0 * g for g in range(1, 17)}
    chosen = drive(schedule, 40, plain_ms=100.0, draft_ms_per_token=5.0, verify=verify, accept=0.9)
    assert all(g > 0 for g in chosen[3:])
    assert max(chosen) > 2 and chosen[-1] >= 4
    assert schedule.estimates().speedup[chosen[-1]] > 1.5


def test_picks_a_small_gamma_when_only_a_small_one_pays() -> None:
    # Verify cost rises steeply with width: γ = 1 pays a little, wider passes do not.
    schedule = AdaptiveGamma(4)
    verify = {g: 100.0 + 60.0 * (g - 1) + 10.0 for g in range(1, 17)}
    chosen = drive(schedule, 40, plain_ms=100.0, draft_ms_per_token=10.0, verify=verify, accept=0.8)
    assert chosen[-5:] == [1] * 5


def test_low_acceptance_turns_it_off_even_with_a_cheap_draft() -> None:
    schedule = AdaptiveGamma(3)
    chosen = drive(schedule, 30, plain_ms=100.0, draft_ms_per_token=5.0, verify=140.0, accept=0.05)
    assert chosen[-8:].count(0) >= 7


def test_slow_catch_up_after_a_pause_is_not_taken_as_the_drafting_price() -> None:
    schedule = AdaptiveGamma(2)
    yardstick(schedule)
    schedule.observe(drafted_round(1, 2, 2, draft_ms_per_token=5.0, verify_ms=105.0))
    for n in range(2, 12):
        schedule.observe(plain_round(n))
    # The draft read the ten plain rounds' tokens (2 ms each) before drafting its two (5 ms each).
    caught = replace(drafted_round(12, 2, 2, draft_ms_per_token=15.0, verify_ms=105.0), caught_up=10)
    schedule.observe(caught)
    assert schedule.estimates().draft_ms_per_token == pytest.approx(5.0)
    assert schedule.costs.catch_up_ms("model") == pytest.approx(2.0)


def test_estimates_are_kept_per_drafter() -> None:
    schedule = AdaptiveGamma(3)
    yardstick(schedule)
    for n in range(1, 6):
        schedule.observe(drafted_round(n, 3, 0, draft_ms_per_token=50.0, verify_ms=150.0))
    model_alpha = schedule.alpha
    for n in range(6, 12):
        schedule.observe(drafted_round(n, 3, 3, draft_ms_per_token=0.1, verify_ms=150.0, drafter="ngram"))
    assert schedule.drafter == "ngram" and schedule.alpha > 0.8 > model_alpha


def test_gamma_is_sized_for_the_source_about_to_propose() -> None:
    # A hybrid drafter: the model drafts expensively and is mostly rejected; lookups are free and
    # mostly right. The schedule must switch the model off yet keep drafting long lookups.
    schedule = AdaptiveGamma(3)
    yardstick(schedule, 100.0)
    for n in range(1, 17):  # enough tested positions that a low α is believed
        schedule.observe(drafted_round(n, 2, 0, draft_ms_per_token=60.0, verify_ms=110.0))
        schedule.observe(drafted_round(n, 4, 3, draft_ms_per_token=0.1, verify_ms=112.0, drafter="ngram"))
    assert schedule.next_gamma("model") == 0
    assert schedule.next_gamma("ngram") >= 3


def test_positions_tested() -> None:
    assert positions_tested(RoundEvent(0, 4, 4, 4, 0, 0, "model")) == 4
    assert positions_tested(RoundEvent(0, 4, 4, 1, 0, 0, "model")) == 2
    assert positions_tested(RoundEvent(0, 4, 3, 0, 0, 0, "ngram")) == 1


@pytest.mark.parametrize("drafter", ["model", "ngram"])
def test_adaptive_in_the_engine_equals_plain(long_pair: TinyPair, drafter: str) -> None:
    engine = ChatEngine(long_pair.target, long_pair.tokenizer, long_pair.draft)  # a fresh schedule
    prompt = engine.prompt_ids([{"role": "user", "content": "the cat sat on the mat. the cat sat on"}])
    controls = Controls(gamma=3, schedule="adaptive", drafter=drafter, max_new_tokens=40)
    plain = [e.token_id for e in engine.stream_plain(prompt, controls) if isinstance(e, TokenEvent)]
    events = list(engine.stream_ids(prompt, controls))
    assert [e.token_id for e in events if isinstance(e, TokenEvent)] == plain
    rounds = [e for e in events if isinstance(e, RoundEvent)]
    assert [r.gamma for r in rounds[:3]] == [0, 0, 0]  # the yardstick rounds


def test_a_later_reply_starts_with_what_earlier_replies_measured() -> None:
    """The first round of the first reply is a plain step (it measures the yardstick); later
    replies of the same engine skip it and start at the γ the measurements favour."""
    schedule = AdaptiveGamma(lambda: 4)
    drive(schedule, 30, plain_ms=50.0, draft_ms_per_token=5.0, verify=55.0, accept=0.8)
    schedule.begin_reply(lambda: 1)
    assert schedule.next_gamma() > 1


def test_the_engine_keeps_one_schedule_per_name_across_replies(long_pair: TinyPair) -> None:
    engine = ChatEngine(long_pair.target, long_pair.tokenizer, long_pair.draft)
    prompt = engine.prompt_ids([{"role": "user", "content": "hello there, how are you today?"}])
    controls = Controls(gamma=3, schedule="adaptive", drafter="model", max_new_tokens=20)
    first = [e for e in engine.stream_ids(prompt, controls) if isinstance(e, RoundEvent)]
    assert first[0].drafted == 0  # the first reply measures a plain step first
    schedule = engine.schedule("adaptive", lambda: 2)
    assert isinstance(schedule, AdaptiveGamma)
    assert schedule.estimates().plain_ms is not None  # what the next reply starts from
    assert engine.schedule("adaptive", lambda: 3) is schedule


def test_one_slow_pass_at_a_width_does_not_rule_that_width_out_for_good() -> None:
    # The bench's translation prompts on this CPU: plain 43 ms, d 11.5 ms, V(1) 47, V(2) 50, α 0.53,
    # where γ = 1 is the fastest. Earlier replies (code, α high) drafted γ = 2, and the one γ = 1
    # pass they timed happened to take 75 ms.
    schedule = AdaptiveGamma(2)
    yardstick(schedule, 43.0)
    for n in range(1, 11):
        schedule.observe(drafted_round(n, 2, 2, draft_ms_per_token=11.5, verify_ms=50.0))
    schedule.observe(drafted_round(11, 1, 1, draft_ms_per_token=11.5, verify_ms=75.0))
    verify = {1: 47.0, 2: 50.0, 3: 54.0, 4: 57.0, 5: 60.0, 6: 70.0}
    chosen = drive(schedule, 120, plain_ms=43.0, draft_ms_per_token=11.5, verify=verify, accept=0.53)
    assert chosen[-40:].count(1) >= 35, chosen


def test_sure_positions_leave_out_the_token_a_draft_stopped_on() -> None:
    assert sure_positions(RoundEvent(0, 4, 2, 1, 0, 0, "model")) == (1, 1)  # cut: 2nd unsure, rejected
    assert sure_positions(RoundEvent(0, 4, 2, 2, 0, 0, "model")) == (1, 1)  # cut: 2nd unsure, accepted
    assert sure_positions(RoundEvent(0, 4, 3, 0, 0, 0, "model")) == (0, 1)  # rejected before the unsure one
    assert sure_positions(RoundEvent(0, 4, 4, 1, 0, 0, "model")) == (1, 2)  # drafted all it was asked
    assert sure_positions(RoundEvent(0, 4, 2, 1, 0, 0, "ngram")) == (1, 2)  # a lookup that ran out


def test_rounds_cut_short_where_the_draft_was_unsure_size_gamma_by_its_sure_tokens() -> None:
    """A draft right whenever it is sure, which stops where unsure: asked for more, it drafts more
    while it is sure; the same outcomes from a draft that was not cut short ask for less."""
    cut, whole = AdaptiveGamma(2), AdaptiveGamma(2)
    for schedule, drafted in ((cut, 2), (whole, 2)):
        yardstick(schedule, 100.0)
        for n in range(1, 30):
            gamma = 4 if schedule is cut else 2
            schedule.observe(RoundEvent(n, gamma, drafted, 1, 20.0 * drafted, 102.0 + drafted, "model"))
    assert cut.alpha == pytest.approx(whole.alpha)  # every tested position counts alike for α
    assert cut.sure_alpha > 0.9 > whole.sure_alpha
    assert cut.next_gamma() > whole.next_gamma() >= 1
