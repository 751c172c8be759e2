"""KV caches stay consistent after fully accepted, fully rejected and partial rounds."""

from __future__ import annotations

import pytest
import torch

from specchat.engine.backend import Controls
from specchat.engine.drafters import Draft
from specchat.engine.events import RoundEvent, TokenEvent
from specchat.engine.kv import CachedLM
from specchat.engine.sampling import SamplingParams
from specchat.engine.session import ChatEngine
from specchat.testing.tiny_models import TinyPair


def greedy_continuation(model: torch.nn.Module, ids: list[int], n: int) -> list[int]:
    ids = list(ids)
    with torch.inference_mode():
        for _ in range(n):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[-n:]


def assert_cache_matches_fresh(lm: CachedLM) -> None:
    """The cache holds exactly cached_ids: next-token logits equal a from-scratch pass."""
    assert lm.cache is not None
    assert lm.cache.get_seq_length() == len(lm.cached_ids)
    probe = [*lm.cached_ids, 5]
    cached = lm.logits_after(probe, 1)
    with torch.inference_mode():
        fresh = lm.model(torch.tensor([probe])).logits[0, -1:]
    torch.testing.assert_close(cached, fresh, rtol=1e-4, atol=1e-4)
    lm._crop(len(probe) - 1)


class ScriptedDrafter:
    """Proposes, round by round: the target's own greedy tokens (all accepted), garbage (all
    rejected), then two right and one wrong (partial)."""

    name = "model"
    read_share = None

    def __init__(self, target: torch.nn.Module, vocab: int, checks: list[CachedLM]) -> None:
        self.target, self.vocab, self.checks = target, vocab, checks
        self.round = 0

    def behind(self, ids: list[int]) -> int:
        return 0

    def next_source(self, ids: list[int]) -> str:
        return "model"

    def propose(
        self,
        ids: list[int],
        gamma: int,
        params: SamplingParams,
        generator: object,
        *,
        window: int | None = None,
    ) -> Draft:
        for lm in self.checks:  # the previous round's rollback must have left a clean cache
            if lm.cache is not None:
                assert_cache_matches_fresh(lm)
        right = greedy_continuation(self.target, ids, 3)
        script = [
            right,
            [(t + 7) % self.vocab for t in right],
            [right[0], right[1], (right[2] + 7) % self.vocab],
        ]
        chosen = script[self.round % 3]
        self.round += 1
        tokens = torch.tensor(chosen)
        return Draft(
            ids=chosen, tokens=tokens, p_draft=torch.nn.functional.one_hot(tokens, self.vocab).float()
        )


def test_target_cache_after_each_kind_of_round(engine: ChatEngine, pair: TinyPair) -> None:
    scripted = ScriptedDrafter(pair.target, engine.vocab_width, [engine.target])
    engine._drafters["model"] = scripted
    engine.stop_ids = engine._decoder.stop_ids = frozenset()
    prompt = engine.prompt_ids([{"role": "user", "content": "hello"}])
    events = list(engine.stream_ids(prompt, Controls(gamma=3, max_new_tokens=40)))
    accepted = [e.accepted for e in events if isinstance(e, RoundEvent)]
    assert accepted[:3] == [3, 0, 2]
    plain = [
        e.token_id
        for e in engine.stream_plain(prompt, Controls(max_new_tokens=40))
        if isinstance(e, TokenEvent)
    ]
    assert [e.token_id for e in events if isinstance(e, TokenEvent)] == plain


def test_draft_model_cache_after_bonus_and_rejection(engine: ChatEngine) -> None:
    prompt = engine.prompt_ids([{"role": "user", "content": "the quick brown fox"}])
    for temperature in (0.0, 1.0):
        events = list(
            engine.stream_ids(prompt, Controls(gamma=4, temperature=temperature, seed=2, max_new_tokens=30))
        )
        kinds = {e.kind for e in events if isinstance(e, TokenEvent)}
        assert "correction" in kinds or "bonus" in kinds
        assert engine.draft is not None
        assert_cache_matches_fresh(engine.draft)
        assert_cache_matches_fresh(engine.target)


def test_prefix_reuse_across_turns_runs_only_the_new_tail(pair: TinyPair) -> None:
    lm = CachedLM(pair.target)
    ids = list(range(3, 23))
    lm.logits_after(ids, 1)
    calls = lm.forward_calls
    extended = [*ids, 7, 8, 9]
    got = lm.logits_after(extended, 2)
    assert lm.forward_calls == calls + 1
    with torch.inference_mode():
        fresh = pair.target(torch.tensor([extended])).logits[0, -2:]
    torch.testing.assert_close(got, fresh, rtol=1e-4, atol=1e-4)


def test_prefill_of_a_cached_prompt_runs_nothing(pair: TinyPair) -> None:
    lm = CachedLM(pair.target)
    prompt = list(range(3, 23))
    lm.prefill(prompt)
    calls = lm.forward_calls
    lm.prefill(prompt)  # sampling the same prompt again
    assert lm.forward_calls == calls
    lm.logits_after([*prompt, 5, 6], 3)  # a reply went further
    lm.prefill(prompt)
    assert lm.forward_calls == calls + 1
    lm.prefill([*prompt[:-2], 9, 9])  # a different prompt still prefills
    assert lm.forward_calls == calls + 2
    with torch.inference_mode():
        fresh = pair.target(torch.tensor([[*prompt[:-2], 9, 9]])).logits[0, -1:]
    torch.testing.assert_close(lm.logits_after([*prompt[:-2], 9, 9], 1), fresh, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("cut", [0, 5, 19])
def test_diverging_history_crops_the_cache(pair: TinyPair, cut: int) -> None:
    lm = CachedLM(pair.target)
    lm.logits_after(list(range(3, 23)), 1)
    other = [*list(range(3, 3 + cut)), 40, 41, 42]
    got = lm.logits_after(other, 1)
    with torch.inference_mode():
        fresh = pair.target(torch.tensor([other])).logits[0, -1:]
    torch.testing.assert_close(got, fresh, rtol=1e-4, atol=1e-4)
    assert_cache_matches_fresh(lm)
