"""Reading ahead (issue 43): the models read the known part of the next prompt while nobody waits,
stop within one chunk when a reply starts, and never change a reply."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from specchat.engine.backend import Controls
from specchat.engine.events import RoundEvent, TokenEvent
from specchat.engine.read_ahead import CHUNK, UNSETTLED
from specchat.engine.session import ChatEngine
from specchat.models.compute.packing import from_hf
from specchat.testing.tiny_models import make_tiny_pair

HISTORY = [
    {"role": "user", "content": "the cat sat on the mat. " * 2},
    {"role": "assistant", "content": "the cat sat. the mat was red. "},
]
TYPED = "the dog sat on the mat and the cat sat on the dog. "


def native_engine() -> ChatEngine:
    pair = make_tiny_pair(seed=2, draft_noise=0.5, logit_scale=2.5)
    target, draft = from_hf(pair.target, bits=4), from_hf(pair.draft, bits=4)
    return ChatEngine(target, pair.tokenizer, draft)


def reply(engine: ChatEngine, messages: list[dict[str, str]]) -> tuple[list[int], list[RoundEvent]]:
    events = list(engine.stream_chat(messages, Controls(gamma=3, drafter="hybrid", max_new_tokens=40)))
    tokens = [e.token_id for e in events if isinstance(e, TokenEvent)]
    return tokens, [e for e in events if isinstance(e, RoundEvent)]


def test_what_was_read_ahead_is_not_read_again_and_the_reply_is_the_same() -> None:
    messages = [*HISTORY, {"role": "user", "content": TYPED}]
    cold = native_engine()
    expected, _ = reply(cold, messages)

    warm = native_engine()
    controls = Controls(drafter="hybrid")
    warm.read_ahead(messages, controls, threading.Event())
    done = warm.last_read_ahead
    prompt = warm.prompt_ids(messages)
    assert done is not None and not done.stopped
    assert done.read == {"target": len(prompt) - UNSETTLED, "draft": len(prompt) - UNSETTLED}
    assert warm.target.cached_ids == prompt[: len(prompt) - UNSETTLED]
    calls = warm.target.forward_calls
    got, rounds = reply(warm, messages)
    assert got == expected  # the same reply, bit for bit
    assert warm.target.forward_calls - calls == len(rounds) + 1  # the prefill read only the tail
    model_rounds = [e for e in rounds if e.drafter == "model" and e.drafted]
    assert all(e.caught_up <= UNSETTLED + 4 for e in model_rounds)


def test_a_reply_stops_a_read_ahead_within_one_chunk() -> None:
    engine = native_engine()
    long = [{"role": "user", "content": TYPED * 3}]  # several chunks (the tokenizer reads characters)
    started, release = threading.Event(), threading.Event()
    target = engine.target
    read = target.logits_after

    def held_first_chunk(*args: Any, **kwargs: Any) -> Any:
        if not started.is_set():
            started.set()
            release.wait(5)
        return read(*args, **kwargs)

    target.logits_after = held_first_chunk  # type: ignore[method-assign]
    worker = threading.Thread(target=engine.read_ahead, args=(long, Controls(), threading.Event()))
    worker.start()
    assert started.wait(5)
    starter = threading.Thread(target=lambda: reply_to(engine))
    starter.start()
    while not engine._reply_starts.is_set():  # the reply is waiting for the models
        time.sleep(0.001)
    release.set()  # the chunk under way ends; the read-ahead must stop there
    worker.join(10)
    starter.join(30)
    done = engine.last_read_ahead
    assert done is not None and done.stopped
    assert done.read["target"] <= CHUNK and done.read["draft"] == 0


def reply_to(engine: ChatEngine) -> None:
    list(engine.stream_chat([{"role": "user", "content": "hello"}], Controls(max_new_tokens=4)))


def test_nothing_is_read_ahead_while_a_reply_runs() -> None:
    engine = native_engine()
    running = engine.start_chat([{"role": "user", "content": "hello there"}], Controls(max_new_tokens=8))
    engine.read_ahead([*HISTORY, {"role": "user", "content": TYPED}], Controls(), threading.Event())
    assert engine.last_read_ahead is None
    while not running.done:
        running.step()
    engine.read_ahead([*HISTORY, {"role": "user", "content": TYPED}], Controls(), threading.Event())
    assert engine.last_read_ahead is not None and engine.last_read_ahead.read["target"] > 0


@pytest.mark.parametrize("drafter", ["ngram", "none"])
def test_the_draft_reads_ahead_only_for_a_drafter_that_uses_it(drafter: str) -> None:
    engine = native_engine()
    engine.read_ahead(HISTORY, Controls(drafter=drafter), threading.Event())
    done = engine.last_read_ahead
    assert done is not None and "draft" not in done.read and done.read["target"] > 0


def test_a_torch_model_does_not_read_ahead() -> None:
    # Its rows depend on the width of the pass: a prompt read in chunks would change the reply.
    pair = make_tiny_pair(seed=2)
    engine = ChatEngine(pair.target, pair.tokenizer, pair.draft)
    engine.read_ahead(HISTORY, Controls(drafter="hybrid"), threading.Event())
    done = engine.last_read_ahead
    assert done is not None and done.read == {"target": 0, "draft": 0}
    assert engine.target.cached_ids == []
