"""Rounds rebuilt from llama-server's running totals, on streams captured from the real server."""

from __future__ import annotations

import json

import pytest

from specchat.engine.events import RoundEvent, TokenEvent, known
from specchat.remote.reply_stream import chunk_of as _chunk_of
from specchat.remote.rounds import Chunk, CounterRounds, StepRounds
from tests.remote.server import DATA, sse_events

CAPTURED = ["llama_prime_t0.sse", "llama_cat_story_t0.sse", "llama_french_t08.sse", "llama_hello_eos.sse"]


def replay(name: str) -> tuple[list[TokenEvent], list[RoundEvent], dict]:
    reader = CounterRounds()
    events = []
    final: dict = {}
    for payload in sse_events(DATA / name):
        if payload == "[DONE]":
            break
        data = json.loads(payload)
        chunk, _, timings = _chunk_of(data, "llama-server")
        final = timings or final
        if chunk.finish is not None:
            events += reader.finish(chunk)
        elif chunk.text or chunk.tokens is not None:
            events += reader.feed(chunk)
    tokens = [e for e in events if isinstance(e, TokenEvent)]
    rounds = [e for e in events if isinstance(e, RoundEvent)]
    return tokens, rounds, final


def streamed_text(name: str) -> str:
    out = []
    for payload in sse_events(DATA / name):
        if payload != "[DONE]":
            choices = json.loads(payload)["choices"]
            out.append((choices[0]["delta"].get("content") or "") if choices else "")
    return "".join(out)


@pytest.mark.parametrize("name", CAPTURED)
def test_rounds_add_up_to_the_servers_own_totals(name: str) -> None:
    tokens, rounds, final = replay(name)
    assert sum(r.drafted for r in rounds) == final.get("draft_n", 0)
    assert sum(r.accepted for r in rounds) == final.get("draft_n_accepted", 0)
    assert "".join(t.text for t in tokens) == streamed_text(name)
    # Every generated token is shown, except a stop token (llama-server counts it; nobody shows it).
    stopped = json.loads(sse_events(DATA / name)[-2])["choices"][0]["finish_reason"] == "stop"
    assert len(tokens) == final["predicted_n"] - (1 if stopped else 0)


@pytest.mark.parametrize("name", CAPTURED)
def test_each_round_is_its_accepted_prefix_then_one_closing_token(name: str) -> None:
    tokens, rounds, _ = replay(name)
    by_round: dict[int, list[TokenEvent]] = {}
    for token in tokens:
        by_round.setdefault(token.round, []).append(token)
    for r in rounds:
        kinds = [t.kind for t in by_round.get(r.round, [])]
        closing = "target" if r.drafted == 0 else ("bonus" if r.accepted == r.drafted else "correction")
        if len(kinds) == r.accepted + 1:
            assert kinds == ["accepted"] * r.accepted + [closing]
        else:  # cut short by the stop token or the token budget: no closing token
            assert kinds == ["accepted"] * len(kinds)
        assert r.gamma == r.drafted and not known(r.draft_ms) and not known(r.verify_ms)
    for t in tokens:
        assert t.token_id == -1 and not known(t.p_target)
        assert (t.p_draft is not None and not known(t.p_draft)) if t.kind == "accepted" else t.p_draft is None


def test_the_captured_story_has_the_rounds_the_server_reported() -> None:
    tokens, rounds, _ = replay("llama_cat_story_t0.sse")
    # From the capture: a prefill token, then rounds of 3 drafts with 3, 3, 1, 2, 0 … accepted.
    assert [(r.drafted, r.accepted) for r in rounds[:6]] == [(0, 0), (3, 3), (3, 3), (3, 1), (3, 2), (3, 0)]
    assert [t.kind for t in tokens[:5]] == ["target", "accepted", "accepted", "accepted", "bonus"]
    assert [t.text for t in tokens[9:12]] == [" named", " Wh", "isk"]
    assert [t.kind for t in tokens[9:11]] == ["accepted", "correction"]


def test_a_stop_token_fills_its_round_but_is_not_shown() -> None:
    tokens, rounds, _ = replay("llama_hello_eos.sse")
    assert [t.text for t in tokens] == ["hello"]
    # The round after "hello" drafted 3 and accepted none: its closing token was the stop token.
    assert [(r.drafted, r.accepted) for r in rounds] == [(0, 0), (3, 0)]


def test_a_chunk_covering_two_tokens_gives_its_text_to_the_second() -> None:
    reader = CounterRounds()
    events = reader.feed(Chunk("A", tokens=1, drafted=0, accepted=0))
    events += reader.feed(Chunk("BC", tokens=3, drafted=3, accepted=2))  # one token held back its text
    events += reader.feed(Chunk("D", tokens=4, drafted=3, accepted=2))
    tokens = [e for e in events if isinstance(e, TokenEvent)]
    assert [(t.kind, t.text) for t in tokens] == [
        ("target", "A"),
        ("accepted", ""),
        ("accepted", "BC"),
        ("correction", "D"),
    ]
    assert [e.accepted for e in events if isinstance(e, RoundEvent)] == [0, 2]


def test_vllm_steps_are_rounds_of_their_token_count() -> None:
    reader = StepRounds(gamma=3)
    events = reader.feed(Chunk("The", tokens=1, pieces=("The",)))
    events += reader.feed(Chunk(" cat sat on", tokens=5, pieces=(" cat", " sat", " on", "")))
    events += reader.feed(Chunk(" the mat", tokens=7, pieces=(" the", " mat")))
    tokens = [e for e in events if isinstance(e, TokenEvent)]
    rounds = [e for e in events if isinstance(e, RoundEvent)]
    assert [(r.drafted, r.accepted) for r in rounds] == [(0, 0), (3, 3), (3, 1)]
    assert [t.kind for t in tokens] == [
        "target",
        "accepted",
        "accepted",
        "accepted",
        "bonus",
        "accepted",
        "correction",
    ]
    assert [t.text for t in tokens][1:5] == [" cat", " sat", " on", ""]
