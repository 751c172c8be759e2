"""Each draft's trace carries both models' own softmax (T = 1, unshaped).

At T = 0 the test is argmax equality, so the shaped figures teach nothing; what each model
itself thought of the drafted token is what the inspector shows there.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import pytest
import torch

from specchat.engine.backend import Controls
from specchat.engine.events import DraftTrace, RoundEvent, TokenEvent, known
from specchat.engine.sampling import own_probabilities
from specchat.engine.session import ChatEngine

if TYPE_CHECKING:
    from specchat.engine.kv import EngineModel

PROMPT = [{"role": "user", "content": "abc abc abc, what comes next? abc"}]


def _own(model: EngineModel, ids: list[int], token: int) -> float:
    """softmax at temperature 1 of the model's logits after ``ids``, from scratch (no cache)."""
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([ids])).logits[0, -1]
    return torch.softmax(logits.float(), dim=-1)[token].item()


def _traced(engine: ChatEngine, controls: Controls) -> list[tuple[list[int], RoundEvent]]:
    """(context before the round, the round) for every round that drafted."""
    ids = engine.prompt_ids(PROMPT)
    out: list[tuple[list[int], RoundEvent]] = []
    emitted: list[int] = []
    for event in engine.stream_ids(ids, controls):
        if isinstance(event, RoundEvent):
            if event.drafts:
                out.append((list(ids), event))
            ids += emitted
            emitted = []
        elif isinstance(event, TokenEvent):
            emitted.append(event.token_id)
    return out


@pytest.mark.parametrize(
    "controls",
    [
        Controls(drafter="model", gamma=3, temperature=0.0, max_new_tokens=24),
        Controls(drafter="model", gamma=3, temperature=0.6, top_k=4, top_p=0.9, seed=2, max_new_tokens=24),
    ],
    ids=["greedy", "shaped"],
)
def test_the_target_s_own_softmax_of_each_draft_is_traced(engine: ChatEngine, controls: Controls) -> None:
    rounds = _traced(engine, controls)
    assert rounds
    target = engine.target.model
    for context, round_event in rounds:
        for position, trace in enumerate(round_event.drafts):
            prefix = context + [d.token_id for d in round_event.drafts[:position]]
            assert trace.p_target_own == pytest.approx(
                _own(target, prefix, trace.token_id), rel=1e-4, abs=1e-7
            )


def test_shaping_shows_in_the_trace_beside_the_own_softmax(engine: ChatEngine) -> None:
    """top-k 4 zeroes most of the target's tokens: its own softmax of them is still positive."""
    controls = Controls(drafter="model", gamma=3, temperature=0.6, top_k=4, seed=2, max_new_tokens=24)
    traces = [t for _, r in _traced(engine, controls) for t in r.drafts]
    assert any(t.p_target == 0.0 and t.p_target_own > 0.0 for t in traces)


def test_at_t0_the_draft_model_s_own_softmax_is_traced(engine: ChatEngine) -> None:
    controls = Controls(drafter="model", gamma=3, temperature=0.0, max_new_tokens=24)
    draft = engine.draft.model  # type: ignore[union-attr]
    for context, round_event in _traced(engine, controls):
        for position, trace in enumerate(round_event.drafts):
            prefix = context + [d.token_id for d in round_event.drafts[:position]]
            assert trace.p_draft_own == pytest.approx(_own(draft, prefix, trace.token_id), rel=1e-4, abs=1e-7)
            assert trace.p_draft_own < 1.0  # the tiny draft is never that sure: not a one-hot row


@pytest.mark.parametrize(
    "controls",
    [
        Controls(drafter="ngram", gamma=3, temperature=0.0, max_new_tokens=24),
        Controls(drafter="model", gamma=3, temperature=0.8, seed=1, max_new_tokens=24),
    ],
    ids=["lookup", "shaped-draft"],
)
def test_a_draft_probability_the_round_does_not_hold_is_unknown(
    engine: ChatEngine, controls: Controls
) -> None:
    """A lookup has no probability of its own (its row is one-hot), and at T > 0 the draft's
    logits are gone: unknown, never the shaped 1.0 or q passed off as the model's own."""
    traces = [t for _, r in _traced(engine, controls) for t in r.drafts]
    assert traces
    assert not any(known(t.p_draft_own) for t in traces)


def test_own_figures_survive_json_and_older_files_read_them_as_unknown() -> None:
    trace = DraftTrace(7, "x", 0.0, 0.5, 0.0, 0.3, "rejected", 0.125, 0.25)
    again = DraftTrace.from_json(trace.to_json())
    assert (again.p_target_own, again.p_draft_own) == (0.125, 0.25)
    older = {k: v for k, v in trace.to_json().items() if not k.endswith("_own")}
    loaded = DraftTrace.from_json(older)
    assert math.isnan(loaded.p_target_own) and math.isnan(loaded.p_draft_own)
    unknown = DraftTrace(7, "x", 0.0, 0.5, 0.0, 0.3, "rejected")
    assert unknown.to_json()["p_draft_own"] is None  # JSON has no NaN


def test_own_probabilities_is_the_plain_softmax_and_zero_past_the_rows() -> None:
    logits = torch.tensor([[0.0, 1.0, 2.0], [3.0, 0.0, 0.0], [9.0, 9.0, 9.0]])
    tokens = torch.tensor([2, 0, 5])
    got = own_probabilities(logits, tokens)
    assert got[0].item() == pytest.approx(torch.softmax(logits[0], -1)[2].item())
    assert got[1].item() == pytest.approx(torch.softmax(logits[1], -1)[0].item())
    assert got[2].item() == 0.0
