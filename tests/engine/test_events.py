"""Event-stream invariants, and summaries that agree with the events they summarise."""

from __future__ import annotations

import pytest

from specchat.engine.backend import Controls
from specchat.engine.costs import expected_tokens_per_round, predicted_speedup
from specchat.engine.events import Event, RoundEvent, SummaryEvent, TokenEvent
from specchat.engine.metrics import StreamStats
from specchat.engine.session import ChatEngine


def split_rounds(events: list[Event]) -> list[tuple[list[TokenEvent], RoundEvent]]:
    rounds: list[tuple[list[TokenEvent], RoundEvent]] = []
    pending: list[TokenEvent] = []
    for event in events:
        if isinstance(event, TokenEvent):
            pending.append(event)
        elif isinstance(event, RoundEvent):
            rounds.append((pending, event))
            pending = []
    assert pending == [], "tokens after the last round event"
    return rounds


def check_invariants(events: list[Event]) -> None:
    assert isinstance(events[-1], SummaryEvent)
    assert sum(isinstance(e, SummaryEvent) for e in events) == 1
    summary = events[-1]
    rounds = split_rounds(events[:-1])
    for index, (tokens, info) in enumerate(rounds):
        assert info.round == index
        assert all(t.round == index for t in tokens)
        assert [t.position for t in tokens] == list(range(len(tokens)))
        assert 0 <= info.accepted <= info.drafted <= info.gamma
        truncated = index == len(rounds) - 1 and summary.stop == "eos"
        kinds = [t.kind for t in tokens]
        if truncated and (not kinds or kinds[-1] == "accepted"):
            assert all(k == "accepted" for k in kinds)
            continue
        *leading, closing = kinds
        assert leading == ["accepted"] * info.accepted
        if info.drafted == 0:
            assert closing == "target"
        elif info.accepted == info.drafted:
            assert closing == "bonus"
        else:
            assert closing == "correction"
        for token in tokens[:-1]:
            assert token.p_draft is not None and 0.0 < token.p_draft <= 1.0
        assert 0.0 <= tokens[-1].p_target <= 1.0


def check_summary(events: list[Event]) -> None:
    summary = events[-1]
    assert isinstance(summary, SummaryEvent)
    stats = StreamStats()
    stats.extend(events[:-1])
    assert summary.tokens == stats.tokens == sum(isinstance(e, TokenEvent) for e in events)
    assert summary.rounds == stats.rounds
    assert (summary.drafted, summary.accepted) == (stats.drafted, stats.accepted)
    assert summary.alpha == stats.alpha
    assert summary.tau == pytest.approx(stats.tokens / stats.rounds)
    assert summary.per_position == stats.per_position
    assert summary.tokens_per_s == pytest.approx(summary.tokens / summary.decode_s)


CONFIGS = [
    Controls(drafter="model", gamma=3, max_new_tokens=40),
    Controls(drafter="model", gamma=5, temperature=1.0, seed=3, max_new_tokens=40),
    Controls(
        drafter="model", gamma=2, schedule="heuristic", temperature=0.8, top_p=0.9, seed=5, max_new_tokens=40
    ),
    Controls(drafter="ngram", gamma=4, max_new_tokens=40),
    Controls(drafter="ngram", gamma=3, temperature=1.0, seed=1, max_new_tokens=40),
    Controls(drafter="none", max_new_tokens=20),
]


@pytest.mark.parametrize(
    "controls", CONFIGS, ids=lambda c: f"{c.drafter}-g{c.gamma}-t{c.temperature}-{c.schedule}"
)
def test_rounds_and_summary(engine: ChatEngine, controls: Controls) -> None:
    prompt = engine.prompt_ids([{"role": "user", "content": "abc abc abc, what comes next? abc"}])
    events = list(engine.stream_ids(prompt, controls))
    check_invariants(events)
    check_summary(events)
    assert events[-1].tokens <= controls.max_new_tokens  # type: ignore[union-attr]


def test_plain_events_have_the_same_shape(engine: ChatEngine) -> None:
    prompt = engine.prompt_ids([{"role": "user", "content": "hi"}])
    events = list(engine.stream_plain(prompt, Controls(max_new_tokens=12)))
    check_invariants(events)
    check_summary(events)
    assert {e.kind for e in events if isinstance(e, TokenEvent)} == {"target"}


def test_eos_inside_an_accepted_run_ends_the_reply(engine: ChatEngine) -> None:
    """Make every token a stop token except the first few: the reply ends at the first stop."""
    prompt = engine.prompt_ids([{"role": "user", "content": "abc abc"}])
    full = [
        e.token_id
        for e in engine.stream_ids(prompt, Controls(gamma=6, max_new_tokens=30))
        if isinstance(e, TokenEvent)
    ]
    stop_at = 5
    engine._decoder.stop_ids = frozenset({full[stop_at]})
    events = list(engine.stream_ids(prompt, Controls(gamma=6, max_new_tokens=30)))
    got = [e.token_id for e in events if isinstance(e, TokenEvent)]
    assert got == full[: full.index(full[stop_at])]
    assert events[-1].stop == "eos"  # type: ignore[union-attr]
    check_invariants(events)
    check_summary(events)


def test_stops_at_the_context_limit(engine: ChatEngine) -> None:
    prompt = engine.prompt_ids([{"role": "user", "content": "x" * 200}])
    events = list(engine.stream_ids(prompt, Controls(gamma=4, max_new_tokens=500)))
    summary = events[-1]
    assert summary.stop in ("context", "eos")  # type: ignore[union-attr]
    assert len(prompt) + summary.tokens <= engine.max_context  # type: ignore[union-attr,operator]


def test_analytic_formula_matches_the_seed_worked_example() -> None:
    assert expected_tokens_per_round(0.7, 4) == pytest.approx(2.7731, abs=1e-4)
    assert predicted_speedup(0.7, 4, 0.08) == pytest.approx(2.10, abs=0.01)
    assert predicted_speedup(0.4, 4, 0.08) == pytest.approx(1.25, abs=0.01)
    assert predicted_speedup(0.4, 8, 0.08) == pytest.approx(1.016, abs=0.001)
    assert expected_tokens_per_round(0.85, 3) == pytest.approx(3.187, abs=1e-3)
