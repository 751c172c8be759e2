"""The adaptive schedule on synthetic machines and acceptance streams (issue 31, item 4).

Each machine is a cost model like the ones measured on this project's CPUs: a plain step, a
draft step, a verify pass by width, and what the draft pays per token when it catches up on
text it has not read (the prompt at its first draft, plain rounds' tokens later). Acceptance is
a seeded Bernoulli stream per tested position. Where the costs and α say drafting cannot pay,
the schedule must be off from round 16 on (probes apart) and decode within a few percent of
plain; where drafting pays it must stay on.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from specchat.engine.costs import ROUTINE_CATCH_UP, expected_tokens_per_round
from specchat.engine.events import RoundEvent
from specchat.engine.gamma import AdaptiveGamma, RoundOutlook


@dataclass(frozen=True)
class Machine:
    plain_ms: float
    draft_ms: float
    """Per drafted token."""
    v: Callable[[int], float]
    """v(γ): a verify pass over γ + 1 positions, in plain steps."""
    catch_up_ms: float
    """Per token the draft catches up on (a batched read: a fraction of a draft step)."""
    drafter: str = "model"


@dataclass
class Played:
    events: list[RoundEvent]
    tokens: int
    ms: float

    @property
    def speedup(self) -> float:
        """Over plain decoding of the same tokens on the same machine."""
        return self.tokens * self.plain_ms / self.ms

    plain_ms: float = 0.0

    @property
    def gammas(self) -> list[int]:
        return [e.gamma for e in self.events]


def play(
    schedule: AdaptiveGamma,
    machine: Machine,
    alpha: Callable[[int], float],
    rounds: int,
    *,
    prompt: int = 120,
    budget: int | None = None,
    seed: int = 0,
    window: int | None = None,
    prefill_ms: float | None = None,
    read_share: float | None = None,
) -> Played:
    """One reply of ``rounds`` rounds (or until ``budget`` tokens), as the engine runs it."""
    rng = random.Random(seed)
    behind = prompt if machine.drafter == "model" else 0
    tokens = 0
    ms = 0.0
    events: list[RoundEvent] = []
    for n in range(rounds):
        remaining = None if budget is None else budget - tokens
        if remaining is not None and remaining <= 0:
            break
        outlook = RoundOutlook(
            remaining=remaining,
            produced=tokens,
            behind=behind,
            window=window,
            prefill_ms_per_token=prefill_ms,
            read_share=read_share,
        )
        gamma = schedule.next_gamma(machine.drafter, outlook)
        if remaining is not None:
            gamma = min(gamma, remaining - 1)
        if gamma == 0:
            event = RoundEvent(n, 0, 0, 0, 0.0, machine.plain_ms, machine.drafter, note=schedule.note)
            behind += machine.drafter == "model"
            tokens += 1
        else:
            accepted = 0
            while accepted < gamma and rng.random() < alpha(n):
                accepted += 1
            window = schedule.window  # a probe drafting from the last few tokens only
            caught = (min(behind, window) if window else behind) if machine.drafter == "model" else 0
            catch_up = caught * machine.catch_up_ms if caught > ROUTINE_CATCH_UP else 0.0
            draft_ms = gamma * machine.draft_ms + catch_up
            verify_ms = machine.plain_ms * machine.v(gamma)
            event = RoundEvent(
                n,
                gamma,
                gamma,
                accepted,
                draft_ms,
                verify_ms,
                machine.drafter,
                caught_up=caught,
                note=schedule.note,
            )
            # After a window, the draft keeps reading from the window's start (ModelDrafter.view).
            behind = (2 if accepted == gamma else 1) if machine.drafter == "model" else 0
            tokens += accepted + 1
        schedule.observe(event)
        events.append(event)
        ms += event.draft_ms + event.verify_ms
    return Played(events, tokens, ms, machine.plain_ms)


def steady(value: float) -> Callable[[int], float]:
    return lambda n: value


# Costs as measured on this project's VM (docs/lab/2026-12-04-schedule.md): plain step, draft
# step, v(γ) and the draft's catch-up per token, today and with flatter verify kernels.
AVX2_TODAY = Machine(
    34.0, 8.2, lambda g: [1.0, 1.02, 1.21, 1.54, 1.91][min(g, 4)] + 0.38 * max(g - 4, 0), 2.6
)
AVX512_TODAY = Machine(30.0, 9.0, lambda g: 1.0 + 0.06 * g + 0.05 * max(g - 3, 0) ** 2, 2.2)
FLAT_KERNELS = Machine(30.0, 9.0, lambda g: 1.0 + 0.03 * g, 2.2)
SLOW_DRAFT = Machine(100.0, 60.0, lambda g: 1.9, 15.0)
LOOKUPS = Machine(34.0, 0.3, lambda g: 1.0 + 0.15 * g, 0.0, drafter="ngram")


CANNOT_PAY = [
    pytest.param(AVX2_TODAY, 0.15, id="avx2-today-alpha-0.15"),
    pytest.param(AVX512_TODAY, 0.2, id="avx512-alpha-0.2"),
    pytest.param(SLOW_DRAFT, 0.5, id="slow-draft-alpha-0.5"),
    pytest.param(LOOKUPS, 0.08, id="lookups-rarely-right"),
]


@pytest.mark.parametrize(("machine", "alpha"), CANNOT_PAY)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_off_within_16_rounds_where_drafting_cannot_pay(machine: Machine, alpha: float, seed: int) -> None:
    schedule = AdaptiveGamma(4)
    played = play(schedule, machine, steady(alpha), 400, seed=seed)
    later = played.events[16:]
    off = [e for e in later if not e.drafted]
    assert len(off) >= 0.7 * len(later), played.gammas[:40]
    if machine.drafter == "model":
        # Drafted rounds from here on are probes, or a short re-measuring after a probe that
        # went through whole (a sign the text may have changed). Lookups' probes cost so
        # little that a lucky one may also bring a few rounds of drafting: the cost bound
        # below is what holds them.
        assert all("a probe" in e.note or "measuring α" in e.note for e in later if e.drafted)
    assert all(e.note.startswith(("plain: drafting cannot pay", "plain: timing")) for e in off), off[-1].note
    # What the probes add, over decoding those rounds plainly: at most the probe share (2 %).
    spent = sum(e.draft_ms + e.verify_ms for e in later)
    produced = len(off) + sum(e.accepted + 1 for e in later if e.drafted)
    assert spent <= 1.025 * produced * machine.plain_ms
    assert played.speedup >= 0.9, played.speedup  # the first rounds' measuring included


PAYS = [
    pytest.param(AVX2_TODAY, 0.8, id="avx2-today-alpha-0.8"),
    pytest.param(AVX512_TODAY, 0.75, id="avx512-alpha-0.75"),
    pytest.param(FLAT_KERNELS, 0.7, id="flat-kernels-alpha-0.7"),
    pytest.param(LOOKUPS, 0.9, id="lookups-on-code"),
]


@pytest.mark.parametrize(("machine", "alpha"), PAYS)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_stays_on_where_drafting_pays(machine: Machine, alpha: float, seed: int) -> None:
    schedule = AdaptiveGamma(4)
    played = play(schedule, machine, steady(alpha), 300, seed=seed)
    later = played.events[16:]
    assert sum(1 for e in later if e.drafted) >= 0.95 * len(later), played.gammas[:40]
    assert played.speedup >= 0.9 * best_speedup(machine, alpha), played.speedup


def best_speedup(machine: Machine, alpha: float) -> float:
    """The seed formula's best γ on this machine: what a schedule that knew everything gets."""
    c = machine.draft_ms / machine.plain_ms
    return max(expected_tokens_per_round(alpha, g) / (g * c + machine.v(g)) for g in range(1, 17))


def informed(machine: Machine, alpha: float) -> AdaptiveGamma:
    """A schedule that has measured this machine over an earlier reply (the chat's later turns)."""
    schedule = AdaptiveGamma(4)
    play(schedule, machine, steady(alpha), 200)
    schedule.begin_reply(lambda: 4)
    return schedule


def test_a_short_reply_after_a_long_prompt_is_not_worth_the_drafts_catch_up() -> None:
    # 1.15x on paper, but reading a 600-token prompt (1.6 s) cannot be won back in 40 tokens.
    schedule = informed(AVX2_TODAY, 0.8)
    short = play(schedule, AVX2_TODAY, steady(0.8), 100, prompt=600, budget=40)
    assert all(e.drafted == 0 for e in short.events)
    note = short.events[0].note
    assert "would first read 600 tokens (~1.6 s)" in note and "can win at most" in note, note
    schedule.begin_reply(lambda: 4)
    # A long reply reads it once drafting could have won the read back in the reply so far (the
    # ski rental rule: 1.6 s at a few ms won a token), and then pays.
    long = play(schedule, AVX2_TODAY, steady(0.8), 600, prompt=600, budget=600)
    first = next(n for n, e in enumerate(long.events) if e.drafted)
    assert 50 <= first <= 300, first
    assert long.events[first].caught_up >= 600 and long.speedup > 1.05, long.speedup


def test_the_draft_reads_the_prompt_only_if_it_drafts() -> None:
    # The first reply of a session: plain step, then a first draft that catches up on the prompt.
    schedule = AdaptiveGamma(4)
    played = play(schedule, AVX512_TODAY, steady(0.75), 30, prompt=200)
    first_draft = next(e for e in played.events if e.drafted)
    assert first_draft.caught_up == 203  # the prompt and the three plain rounds' tokens
    assert schedule.costs.catch_up_ms("model") == pytest.approx(2.2, rel=0.05)


def test_drafting_comes_back_when_the_text_turns_predictable() -> None:
    # Lookups: chat for 150 rounds (rarely right), then a quoted passage (nearly always right).
    schedule = AdaptiveGamma(4)
    played = play(schedule, LOOKUPS, lambda n: 0.08 if n < 150 else 0.95, 400)
    assert all("a probe" in e.note for e in played.events[30:150] if e.drafted)
    back = next(n for n, e in enumerate(played.events) if n >= 150 and e.drafted and "predicted" in e.note)
    assert back - 150 <= 60, back
    after = played.events[back:]
    assert sum(1 for e in after if e.drafted) >= 0.95 * len(after)


def test_drafting_comes_back_when_the_machine_frees_up() -> None:
    # Verify passes cost 1.9 steps while another job shares the cores, then 1.05 once it ends.
    busy = Machine(34.0, 1.0, lambda g: 1.9, 0.0, drafter="ngram")
    schedule = AdaptiveGamma(4)
    play(schedule, busy, steady(0.6), 150)
    assert schedule.next_gamma("ngram", RoundOutlook()) == 0
    free = Machine(34.0, 1.0, lambda g: 1.0 + 0.02 * g, 0.0, drafter="ngram")
    played = play(schedule, free, steady(0.6), 300)
    first = next(n for n, e in enumerate(played.events) if e.drafted)
    assert first <= 40 and sum(e.drafted > 0 for e in played.events[first + 80 :]) >= 0.9 * (300 - first - 80)


def test_a_model_probe_reads_only_the_last_tokens_so_it_stays_cheap() -> None:
    # The draft model, off on chat text; then the reply turns into code it predicts well. A probe
    # drafts from the last 48 tokens (not the hundreds it fell behind by), and the draft reads on
    # from there, so a later probe reads only the tokens since; probes cost at most their share,
    # and one that goes through whole brings drafting back.
    schedule = AdaptiveGamma(4)
    played = play(schedule, AVX512_TODAY, lambda n: 0.15 if n < 100 else 0.9, 700)
    probes = [e for e in played.events if "a probe" in e.note]
    assert probes and "from the last 48 tokens" in probes[0].note and probes[0].caught_up == 48
    assert all(e.caught_up <= 48 for e in probes)
    back = next(n for n, e in enumerate(played.events) if n >= 100 and e.drafted and "predicted" in e.note)
    assert back <= 100 + 450, back
    assert sum(1 for e in played.events[back + 30 :] if e.drafted) >= 0.9 * len(played.events[back + 30 :])


def test_while_off_a_note_says_when_only_the_estimate_would_pay() -> None:
    # Off after chat text (α 0.15); then lucky probes lift α's estimate past break-even while its
    # lower bound still is not: the note must not read "cannot pay" beside a speed-up above 1×.
    schedule = AdaptiveGamma(4)
    played = play(schedule, AVX512_TODAY, lambda n: 0.15 if n < 100 else 0.9, 700)
    unsure = [e for e in played.events if "for sure yet" in e.note]
    assert unsure, [e.note for e in played.events[100:160]]
    for event in unsure:
        figures = event.note.split(";")[1].split(",")[:2]
        estimate, at_low = (float(part.split("×")[0].split()[-1]) for part in figures)
        assert estimate >= 1.03 > at_low, event.note


def off_for_both_drafters() -> AdaptiveGamma:
    """A hybrid reply's schedule after chat text: the draft model and the lookups both off."""
    schedule = AdaptiveGamma(4)
    play(schedule, AVX2_TODAY, steady(0.15), 60)
    play(schedule, LOOKUPS, steady(0.05), 60)
    assert schedule.next_gamma("model", RoundOutlook(behind=300)) == 0
    assert schedule.next_gamma("ngram", RoundOutlook()) == 0
    return schedule


def test_a_lookup_probe_that_went_through_does_not_bring_on_a_draft_model_probe() -> None:
    # A hybrid drafter alternates sources. A lookup's lucky hit says nothing of the draft model,
    # whose probe would cost a catch-up: on the avx2 build it came 9 rounds after one, at 4 % of
    # the reply (docs/lab/2026-12-05-plain-rounds.md).
    schedule = off_for_both_drafters()
    for n in range(12):
        schedule.observe(RoundEvent(n, 0, 0, 0, 0.0, AVX2_TODAY.plain_ms, "model"))
    hit = RoundEvent(12, 1, 1, 1, 0.3, 1.15 * AVX2_TODAY.plain_ms, "ngram", note="a probe")
    schedule.observe(hit)
    for n in range(13, 25):
        schedule.observe(RoundEvent(n, 0, 0, 0, 0.0, AVX2_TODAY.plain_ms, "model"))
        assert schedule.next_gamma("model", RoundOutlook(behind=300)) == 0, schedule.note
    assert schedule.next_gamma("ngram", RoundOutlook()) > 0  # the lookups' own next probe is soon


def test_no_probe_in_the_last_rounds_of_a_reply() -> None:
    schedule = off_for_both_drafters()
    schedule.begin_reply(lambda: 4)
    near_end = play(schedule, LOOKUPS, steady(0.05), 400, budget=400)
    last = near_end.events[-schedule.probe_first :]
    assert any(e.drafted for e in near_end.events[:-20]) and not any(e.drafted for e in last)


# The real AVX2 machine of issue 43 (2 Zen 3 cores): the target read a 798-token prompt at 21.8 ms
# a token; the 0.5B draft's layers hold 0.27 of the 1.5B target's weights.
ZEN3_PREFILL_MS, DRAFT_SHARE = 21.8, 0.27


def test_a_first_draft_after_a_long_prompt_is_priced_from_the_targets_prefill() -> None:
    # A fresh schedule (the bench's first prompt, `specchat generate`): no catch-up timed yet.
    # Reading 800 tokens at 21.8 × 0.27 ms each (~4.7 s) cannot be won back in a 128-token reply.
    schedule = AdaptiveGamma(4)
    played = play(
        schedule, AVX2_TODAY, steady(0.8), 200, prompt=800, budget=128,
        prefill_ms=ZEN3_PREFILL_MS, read_share=DRAFT_SHARE,
    )  # fmt: skip
    assert not any(e.drafted for e in played.events), played.gammas
    notes = [e.note for e in played.events if "would first read" in e.note]
    # The prompt and the plain steps that time V(0) first.
    assert notes and "would first read 803 tokens (~4.7 s)" in notes[0], played.events[5].note
    assert "can win at most" in notes[0]


def test_a_draft_far_behind_reads_a_window_where_that_pays() -> None:
    # The same reply with a 64-token window: ~0.38 s to read, repaid within the reply. The draft
    # reads the window once and drafts on from there (1 or 2 tokens behind a round).
    schedule = AdaptiveGamma(4)
    played = play(
        schedule, AVX2_TODAY, steady(0.8), 200, prompt=800, budget=128, window=64,
        prefill_ms=ZEN3_PREFILL_MS, read_share=DRAFT_SHARE,
    )  # fmt: skip
    drafted = [e for e in played.events if e.drafted]
    assert drafted and drafted[0].caught_up == 64, played.gammas
    assert "read the last 64 of 8" in drafted[0].note, drafted[0].note
    assert all(e.caught_up <= 8 for e in drafted[1:]), [e.caught_up for e in drafted]
    assert played.speedup > 1.1, played.speedup


def test_a_prompt_shorter_than_the_window_is_read_whole() -> None:
    # The draft's guesses are best with all of the text.
    schedule = AdaptiveGamma(4)
    played = play(
        schedule, AVX2_TODAY, steady(0.8), 200, prompt=120, budget=512, window=256,
        prefill_ms=ZEN3_PREFILL_MS, read_share=DRAFT_SHARE,
    )  # fmt: skip
    first = next(e for e in played.events if e.drafted)
    assert first.caught_up > 120, first


def test_a_reply_that_ends_early_never_pays_for_a_long_read() -> None:
    # Extraction answers of 13-33 tokens after 200-280-token prompts (Spec-Bench, T = 0.7): judged
    # on the tokens produced so far, a read that 13 tokens cannot win back is never made.
    schedule = informed(AVX512_TODAY, 0.85)
    played = play(schedule, AVX512_TODAY, steady(0.85), 100, prompt=250, budget=14)
    assert not any(e.drafted for e in played.events), played.gammas
    assert schedule.horizon(RoundOutlook(remaining=500, produced=12)) == 12
    assert schedule.horizon(RoundOutlook(remaining=5, produced=300)) == 5


def test_a_catch_up_is_priced_from_an_earlier_replys_prefill_when_this_one_read_too_little() -> None:
    # A short message after a long prompt: this reply's prefill read a handful of tokens, so it
    # cannot price the draft's read; the earlier reply's prefill still can.
    schedule = AdaptiveGamma(4)
    play(
        schedule,
        AVX2_TODAY,
        steady(0.0),
        3,
        prompt=10,
        budget=128,
        prefill_ms=ZEN3_PREFILL_MS,
        read_share=DRAFT_SHARE,
    )
    schedule.begin_reply(lambda: 4)
    played = play(schedule, AVX2_TODAY, steady(0.8), 20, prompt=800, budget=128, read_share=DRAFT_SHARE)
    assert not played.events[0].drafted and "would first read 800 tokens (~4.7 s)" in played.events[0].note
