"""The hybrid drafter (lookup when the text repeats, the draft model otherwise) stays exact."""

from __future__ import annotations

import pytest

from specchat.bench.engine import BenchControls, BenchEngine
from specchat.engine.events import RoundEvent, TokenEvent
from specchat.errors import InvalidSettingError

PROMPT = "the cat sat on the mat. the cat sat on the mat. the dog"


@pytest.mark.parametrize("schedule", ["fixed", "adaptive"])
def test_hybrid_greedy_equals_plain_and_uses_both_sources(engine: BenchEngine, schedule: str) -> None:
    prompt = engine.prompt_ids([{"role": "user", "content": PROMPT}])
    controls = BenchControls(gamma=3, schedule=schedule, drafter="hybrid", max_new_tokens=60)
    plain = [e.token_id for e in engine.stream_plain(prompt, controls) if isinstance(e, TokenEvent)]
    events = list(engine.stream_ids(prompt, controls))
    assert [e.token_id for e in events if isinstance(e, TokenEvent)] == plain
    sources = {e.drafter for e in events if isinstance(e, RoundEvent) and e.drafted}
    assert sources == {"ngram", "model"}


def test_hybrid_controls_are_checked_like_the_model_drafter() -> None:
    with pytest.raises(InvalidSettingError):
        BenchControls(gamma=0, drafter="hybrid").validate()
    BenchControls(drafter="hybrid").validate()
    with pytest.raises(InvalidSettingError):
        BenchControls(drafter="oracle").validate()
