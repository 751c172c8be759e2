"""Contract v2: every round's trace, checked against the models' own probabilities; the step API."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import pytest
import torch

from specchat.engine.backend import Controls
from specchat.engine.events import RoundEvent, SummaryEvent, TokenEvent
from specchat.engine.sampling import SamplingParams, residual_distribution, shape_probs
from specchat.engine.session import ChatEngine

if TYPE_CHECKING:
    from specchat.engine.kv import EngineModel

PROMPT = [{"role": "user", "content": "hello there, how are you"}]


def _events(engine: ChatEngine, controls: Controls) -> list:
    return list(engine.stream_chat(PROMPT, controls))


def _probs(model: EngineModel, ids: list[int], params: SamplingParams) -> torch.Tensor:
    """The model's shaped distribution after ``ids``, computed from scratch (no cache)."""
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([ids])).logits[0, -1]
    return shape_probs(logits[None], params)[0]


def _replay_rounds(engine: ChatEngine, events: list) -> list[tuple[list[int], RoundEvent, list[TokenEvent]]]:
    """(context before the round, the round, its tokens) for every round of a reply."""
    ids = engine.prompt_ids(PROMPT)
    out, tokens = [], []
    for event in events:
        if isinstance(event, TokenEvent):
            tokens.append(event)
        elif isinstance(event, RoundEvent):
            out.append((list(ids), event, tokens))
            ids += [t.token_id for t in tokens]
            tokens = []
    return out


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_trace_matches_the_models_own_probabilities(engine: ChatEngine, temperature: float) -> None:
    controls = Controls(gamma=4, drafter="model", temperature=temperature, max_new_tokens=40, seed=0)
    params = controls.sampling()
    events = _events(engine, controls)
    rounds = _replay_rounds(engine, events)
    assert any(r.rejected for _, r, _ in rounds), "the tiny pair should reject some drafts"
    target, draft = engine.target.model, engine.draft.model  # type: ignore[union-attr]
    for context, round_event, tokens in rounds:
        assert len(round_event.drafts) == round_event.drafted
        for position, trace in enumerate(round_event.drafts):
            prefix = context + [d.token_id for d in round_event.drafts[:position]]
            p = _probs(target, prefix, params)[trace.token_id].item()
            q = _probs(draft, prefix, params)[trace.token_id].item()
            assert trace.p_target == pytest.approx(p, rel=1e-4, abs=1e-6)
            assert trace.p_draft == pytest.approx(q, rel=1e-4, abs=1e-6)
            assert trace.accept_prob == pytest.approx(min(1.0, p / q), rel=1e-4)
            assert trace.text == engine.token_text(trace.token_id)
            expected = (
                "accepted"
                if position < round_event.accepted
                else "rejected"
                if position == round_event.accepted
                else "untested"
            )
            assert trace.verdict == expected
            if temperature == 0.0 or trace.verdict == "untested":
                assert trace.u is None
            else:
                assert trace.u is not None
                assert (trace.u < trace.accept_prob) == (trace.verdict == "accepted")
        if not tokens or tokens[-1].position != round_event.accepted:
            continue  # a stop token closed the round
        closing = tokens[-1]
        prefix = context + [d.token_id for d in round_event.drafts[: round_event.accepted]]
        p_row = _probs(target, prefix, params)
        if closing.kind == "correction" and temperature > 0:
            assert closing.drawn_from == "residual"
            q_row = _probs(draft, prefix, params)
            source = residual_distribution(p_row[None], q_row[None])[0]
        else:
            assert closing.drawn_from == "target"
            source = p_row
        expected_top = torch.topk(source, 5)
        assert [c.token_id for c in closing.top][:1] == expected_top.indices.tolist()[:1]
        assert [c.p for c in closing.top] == pytest.approx(expected_top.values.tolist(), rel=1e-4, abs=1e-6)
        if temperature == 0.0:
            assert closing.token_id == closing.top[0].token_id  # greedy: the argmax


def test_rejected_drafts_are_the_ones_thrown_away(engine: ChatEngine) -> None:
    events = _events(engine, Controls(gamma=5, drafter="model", max_new_tokens=40))
    for _, round_event, tokens in _replay_rounds(engine, events):
        kept = [t.token_id for t in tokens if t.kind == "accepted"]
        assert kept == [d.token_id for d in round_event.drafts[: round_event.accepted]][: len(kept)]
        if round_event.rejected:
            assert round_event.rejected[0].verdict == "rejected"
            closing = tokens[-1] if tokens else None
            if closing is not None and closing.kind == "correction":
                # Greedy: the correction is the target's argmax, never the rejected draft.
                assert closing.token_id != round_event.rejected[0].token_id


def test_lookup_drafts_have_one_hot_draft_probabilities(engine: ChatEngine) -> None:
    messages = [{"role": "user", "content": "abc abc abc abc abc abc abc abc"}]
    events = list(engine.stream_chat(messages, Controls(gamma=4, drafter="ngram", max_new_tokens=30)))
    traces = [d for e in events if isinstance(e, RoundEvent) for d in e.drafts]
    assert traces
    assert all(d.p_draft == 1.0 and d.accept_prob == pytest.approx(min(1.0, d.p_target)) for d in traces)


def test_jsonl_round_trips_every_v2_field(engine: ChatEngine) -> None:
    events = _events(engine, Controls(gamma=3, drafter="model", temperature=0.8, max_new_tokens=30, seed=1))
    for event in events:
        data = json.loads(json.dumps(event.to_json()))
        kinds: dict[str, type[TokenEvent | RoundEvent | SummaryEvent]] = {
            "token": TokenEvent,
            "round": RoundEvent,
            "summary": SummaryEvent,
        }
        kind = kinds[data["type"]]
        assert kind.from_json(data).to_json() == event.to_json()  # JSON rounds the timings


def test_v1_lines_still_read() -> None:
    token = TokenEvent.from_json(
        {"kind": "accepted", "id": 5, "text": "a", "round": 0, "position": 0, "p_target": 0.5, "p_draft": 0.4}
    )
    assert token.drawn_from == "draft" and token.top == ()
    round_event = RoundEvent.from_json(
        {
            "round": 0,
            "gamma": 2,
            "drafted": 2,
            "accepted": 1,
            "draft_ms": 1.0,
            "verify_ms": 2.0,
            "drafter": "model",
        }
    )
    assert round_event.drafts == () and round_event.rejected == ()


def test_step_runs_exactly_one_round_and_streaming_is_the_same_loop(engine: ChatEngine) -> None:
    controls = Controls(gamma=3, drafter="model", temperature=0.7, max_new_tokens=25, seed=11)
    reply = engine.start_chat(PROMPT, controls)
    stepped: list = []
    while not reply.done:
        events = reply.step()
        rounds = [e for e in events if isinstance(e, RoundEvent)]
        assert len(rounds) <= 1
        assert all(isinstance(e, RoundEvent | TokenEvent) for e in events[:-1])
        stepped.extend(events)
    streamed = _events(engine, controls)

    def strip(events: list) -> list:
        return [
            (e.kind, e.token_id, e.text) if isinstance(e, TokenEvent) else (e.accepted, e.drafted)
            for e in events
            if not isinstance(e, SummaryEvent)
        ]

    assert strip(stepped) == strip(streamed)
    assert isinstance(stepped[-1], SummaryEvent)


def test_finish_between_rounds_ends_the_reply_as_cancelled(engine: ChatEngine) -> None:
    reply = engine.start_chat(PROMPT, Controls(gamma=3, drafter="model", max_new_tokens=50))
    first = reply.step()
    summary = reply.finish()
    assert reply.done and summary.stop == "cancelled"
    assert summary.tokens == sum(isinstance(e, TokenEvent) for e in first)
    assert reply.step() == []


def test_time_between_steps_is_not_decoding_time(engine: ChatEngine) -> None:
    import time

    reply = engine.start_chat(PROMPT, Controls(gamma=2, drafter="model", max_new_tokens=6))
    while not reply.done:
        events = reply.step()
        time.sleep(0.2)  # a paused talk
    summary = events[-1]
    assert isinstance(summary, SummaryEvent)
    rounds_ms = sum(e.draft_ms + e.verify_ms for e in reply.generation.stats.round_events)
    assert summary.decode_s < rounds_ms / 1000.0 + 0.15
