"""Greedy equality on the real packaged pair (Qwen2.5-Coder 1.5B target, 0.5B draft)."""

from __future__ import annotations

import pytest

from specchat.engine.backend import Controls
from specchat.engine.events import SummaryEvent, TokenEvent
from specchat.engine.session import ChatEngine

PROMPT = [{"role": "user", "content": "Write a Python function that checks whether a number is prime."}]


@pytest.mark.slow
@pytest.mark.usefixtures("all_threads")
@pytest.mark.parametrize(("drafter", "gamma"), [("model", 4), ("ngram", 3)])
def test_packaged_pair_greedy_equals_plain(packaged_engine: ChatEngine, drafter: str, gamma: int) -> None:
    ids = packaged_engine.prompt_ids(PROMPT)
    controls = Controls(drafter=drafter, gamma=gamma, max_new_tokens=40)
    plain = [e.token_id for e in packaged_engine.stream_plain(ids, controls) if isinstance(e, TokenEvent)]
    events = list(packaged_engine.stream_ids(ids, controls))
    assert [e.token_id for e in events if isinstance(e, TokenEvent)] == plain
    summary = events[-1]
    assert isinstance(summary, SummaryEvent)
    if drafter == "model":
        assert summary.alpha is not None and summary.alpha > 0.3  # a real pair agrees often
