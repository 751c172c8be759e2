"""The hybrid drafter (lookup when the text repeats, the draft model otherwise) stays exact."""

from __future__ import annotations

import pytest

from specchat.engine.backend import Controls
from specchat.engine.events import RoundEvent, TokenEvent
from specchat.engine.session import ChatEngine
from specchat.errors import InvalidSettingError
from tests.typed import host_draft

PROMPT = "the cat sat on the mat. the cat sat on the mat. the dog"


@pytest.mark.parametrize("schedule", ["fixed", "adaptive"])
def test_hybrid_greedy_equals_plain_and_uses_both_sources(engine: ChatEngine, schedule: str) -> None:
    prompt = engine.prompt_ids([{"role": "user", "content": PROMPT}])
    controls = Controls(gamma=3, schedule=schedule, drafter="hybrid", max_new_tokens=60)
    plain = [e.token_id for e in engine.stream_plain(prompt, controls) if isinstance(e, TokenEvent)]
    events = list(engine.stream_ids(prompt, controls))
    assert [e.token_id for e in events if isinstance(e, TokenEvent)] == plain
    sources = {e.drafter for e in events if isinstance(e, RoundEvent) and e.drafted}
    assert sources == {"ngram", "model"}


def test_hybrid_controls_are_checked_like_the_model_drafter() -> None:
    with pytest.raises(InvalidSettingError):
        Controls(gamma=0, drafter="hybrid").validate()
    Controls(drafter="hybrid").validate()
    with pytest.raises(InvalidSettingError):
        Controls(drafter="oracle").validate()


def test_the_source_announced_is_the_one_that_proposes(engine: ChatEngine) -> None:
    hybrid = engine.drafter("hybrid")
    assert hybrid is not None
    repeating = (
        engine.prompt_ids([{"role": "user", "content": PROMPT}]) + engine.tokenizer(" the cat")["input_ids"]
    )
    fresh = engine.tokenizer("xyz")["input_ids"]
    params = Controls().sampling()
    for ids, source in ((repeating, "ngram"), (fresh, "model")):
        assert hybrid.next_source(ids) == source
        draft = host_draft(hybrid.propose(ids, 1, params, None))
        assert hybrid.name == source and len(draft.ids) == 1


def test_a_one_token_match_is_left_to_the_model(engine: ChatEngine) -> None:
    hybrid = engine.drafter("hybrid")
    lookup = engine.drafter("ngram")
    assert hybrid is not None and lookup is not None
    params = Controls().sampling()
    once = [5, 6, 7, 8, 5]  # only the last token occurred before
    twice = [5, 6, 7, 8, 5, 6]  # the last two did
    assert host_draft(lookup.propose(once, 2, params, None)).ids == [6, 7]  # the n-gram drafter takes it
    assert hybrid.next_source(once) == "model"
    assert hybrid.next_source(twice) == "ngram"
    assert host_draft(hybrid.propose(twice, 2, params, None)).ids == [7, 8]
