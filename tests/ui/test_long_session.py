"""A long session: 200 messages in one chat, with every control changing between them.

Checks that what the KV caches hold tracks the context actually in use (the conversation so
far plus the reply being generated) and does not pile up with the number of turns, and that
every reply was saved. Tiny models with a long context (8192 positions) keep it to seconds
per few dozen turns.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from specchat.engine.kv import CachedLM
from specchat.engine.session import ChatEngine
from specchat.testing.tiny_models import TinyPair, make_model, make_tokenizer, perturbed_copy
from specchat.ui.widgets.prompt import PromptInput

from .conftest import make_app, wait_for

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

MESSAGES = int(__import__("os").environ.get("LONG_SESSION_MESSAGES", "200"))
MAX_NEW_TOKENS = 6


def held_bytes(lm: CachedLM) -> int:
    """Bytes of every tensor storage the model's KV cache keeps alive (a cropped view counts
    its whole storage: that memory is held until the view goes)."""
    if lm.cache is None:
        return 0
    storages: dict[int, int] = {}
    for layer in getattr(lm.cache, "layers", []):
        for tensor in (getattr(layer, "keys", None), getattr(layer, "values", None)):
            if tensor is not None:
                storage = tensor.untyped_storage()
                storages[storage.data_ptr()] = storage.nbytes()
    return sum(storages.values())


def bytes_per_token(lm: CachedLM) -> int:
    config = lm.model.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    # keys and values, every layer, float32
    return 2 * config.num_hidden_layers * config.num_key_value_heads * head_dim * 4


@pytest.fixture(scope="module")
def long_context_pair() -> TinyPair:
    tokenizer = make_tokenizer()
    target = make_model(len(tokenizer), 0, max_positions=8192, logit_scale=8.0)
    return TinyPair(target, perturbed_copy(target, 0.3, 1), tokenizer)


def actions_for(turn: int) -> list[str]:
    """What the keys do before message ``turn`` (F5, F2/F3, F4, F6/F7): every control moves.

    The commands run directly: pressing keys through Pilot waits for the screen to settle
    after each one, which would dominate the test's time; key handling is tested elsewhere.
    """
    actions = ["cycle_drafter"]  # model → hybrid → n-gram → none → model …
    actions.append("gamma_up" if turn % 3 else "gamma_down")
    if turn % 4 == 0:
        actions.append("cycle_schedule")
    actions.append("temperature_up" if turn % 10 < 5 else "temperature_down")
    return actions


async def test_two_hundred_messages_with_changing_controls(long_context_pair: TinyPair) -> None:
    pair = long_context_pair
    engine = ChatEngine(pair.target, pair.tokenizer, pair.draft)
    app = make_app(engine, max_new_tokens=MAX_NEW_TOKENS, gamma=3, system_prompt="be brief.")
    seen: dict[str, set[Any]] = {"drafter": set(), "gamma": set(), "schedule": set(), "temperature": set()}
    worst_excess = 0
    async with app.run_test(size=(100, 24)) as pilot:
        prompt = app.query_one(PromptInput)
        for turn in range(MESSAGES):
            for command in actions_for(turn):
                await app.main_screen.commands.run(command)
            c = app.controls
            assert c is not None
            for name in seen:
                seen[name].add(getattr(c, name))
            prompt.focus()
            prompt.text = f"message {turn}: go on."
            await pilot.press("enter")

            def answered(n: int = turn) -> bool:
                return app.reply is None and len(app.conversation.turns) == 2 * (n + 1)

            await wait_for(pilot, answered)

            # The caches hold at most the conversation in use: its prompt and the reply.
            in_use = len(engine.prompt_ids(app.conversation.chat_messages()))
            for lm in (engine.target, engine.draft):
                assert lm is not None
                assert len(lm.cached_ids) <= in_use + 1
                excess = held_bytes(lm) - bytes_per_token(lm) * (in_use + MAX_NEW_TOKENS + 16)
                worst_excess = max(worst_excess, excess)

        await pilot.pause()
        shown = [reply.text for reply in app.transcript.replies()]

    assert worst_excess <= 0, f"the caches held {worst_excess} bytes beyond the context in use"
    assert len(seen["drafter"]) == 4 and len(seen["schedule"]) == 3
    assert len(seen["gamma"]) > 1 and len(seen["temperature"]) > 1

    saved = json.loads(app.store.path_for(app.conversation.id).read_text())["messages"]
    assert len(saved) == 2 * MESSAGES
    assert [m["content"] for m in saved[0::2]] == [f"message {n}: go on." for n in range(MESSAGES)]
    replies = [m for m in saved if m["role"] == "assistant"]
    assert [m["content"] for m in replies] == [t.content for t in app.conversation.turns[1::2]] == shown
    assert all(m["stats"] is not None for m in replies), "every reply was saved with its figures"
