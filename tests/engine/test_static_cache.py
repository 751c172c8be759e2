"""The static KV cache (the CUDA fast path, run here with graphs off) gives the dynamic cache's tokens.

The same StaticLM code decodes on a GPU, where each pass width replays a CUDA graph; on a CPU it
runs the very same passes eagerly, so these tests check the cache, the rollback by position, the
drafts kept on the device and their stop rule applied there, and the one host read per round.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from typing import TYPE_CHECKING

import pytest
import torch

from specchat.engine.backend import Controls
from specchat.engine.drafters import DeviceDraft, ModelDrafter
from specchat.engine.events import RoundEvent, SummaryEvent, TokenEvent
from specchat.engine.kv import CachedLM
from specchat.engine.session import ChatEngine
from specchat.engine.static import StaticLM, make_cached_lm
from specchat.engine.timing import counted_host_reads
from specchat.testing.tiny_models import make_model, make_tiny_pair, make_tokenizer, perturbed_copy
from tests.engine.test_exactness import (
    ALPHA_LEVEL,
    PROMPT,
    VOCAB_CHARS,
    chi_square_p_value,
    exact_two_token_distribution,
    sample_two_tokens,
)
from tests.typed import model_drafter

if TYPE_CHECKING:
    from transformers import Gemma3ForCausalLM

TEXT = "the cat sat on the mat. the cat sat on"


def token_ids(events: object) -> list[int]:
    return [e.token_id for e in events if isinstance(e, TokenEvent)]  # type: ignore[attr-defined]


def engines(seed: int, logit_scale: float = 2.5) -> tuple[ChatEngine, ChatEngine]:
    pair = make_tiny_pair(seed=seed, draft_noise=0.5, logit_scale=logit_scale)
    dynamic = ChatEngine(pair.target, pair.tokenizer, pair.draft, kv="dynamic")
    static = ChatEngine(pair.target, pair.tokenizer, pair.draft, kv="static")
    return dynamic, static


def test_kv_choice() -> None:
    pair = make_tiny_pair(seed=0)
    assert type(make_cached_lm(pair.target, "auto")) is CachedLM  # a CPU transformers model: unchanged
    assert isinstance(make_cached_lm(pair.target, "static"), StaticLM)
    assert type(make_cached_lm(pair.target, "dynamic")) is CachedLM
    static = ChatEngine(pair.target, pair.tokenizer, pair.draft, kv="static")
    assert isinstance(static.target, StaticLM) and isinstance(static.draft, StaticLM)
    assert not static.target.graphs  # graphs are a CUDA thing


@pytest.mark.parametrize("seed", [0, 2])
@pytest.mark.parametrize("drafter", ["model", "hybrid", "ngram"])
@pytest.mark.parametrize("gamma", [1, 3, 6])
@pytest.mark.parametrize("stop_below", [0.0, 0.5])
def test_greedy_static_equals_dynamic(seed: int, drafter: str, gamma: int, stop_below: float) -> None:
    dynamic, static = engines(seed)
    for engine in (dynamic, static):
        model = engine.drafter("model")
        assert isinstance(model, ModelDrafter)
        model.stop_below = stop_below
    prompt = dynamic.prompt_ids([{"role": "user", "content": TEXT}])
    controls = Controls(gamma=gamma, drafter=drafter, max_new_tokens=48)
    plain = token_ids(dynamic.stream_plain(prompt, controls))
    before = list(dynamic.stream_ids(prompt, controls))
    after = list(static.stream_ids(prompt, controls))
    assert token_ids(after) == token_ids(before) == plain
    assert token_ids(static.stream_plain(prompt, controls)) == plain
    rounds = [(e.drafted, e.accepted) for e in after if isinstance(e, RoundEvent)]
    assert rounds == [(e.drafted, e.accepted) for e in before if isinstance(e, RoundEvent)]
    if drafter != "ngram":
        assert any(accepted < drafted for drafted, accepted in rounds)  # rollbacks were exercised


def test_the_draft_stops_on_the_device_where_the_host_loop_stops() -> None:
    """The stop rule on the device proposes the prefix the host loop proposes, round by round."""
    dynamic, static = engines(0, logit_scale=8.0)  # sure enough that chains of 1 to 5 occur
    for engine in (dynamic, static):
        model_drafter(engine).stop_below = 0.1
    prompt = dynamic.prompt_ids([{"role": "user", "content": TEXT}])
    controls = Controls(gamma=5, drafter="model", max_new_tokens=64)
    before = [e for e in dynamic.stream_ids(prompt, controls) if isinstance(e, RoundEvent)]
    after = [e for e in static.stream_ids(prompt, controls) if isinstance(e, RoundEvent)]
    assert [e.drafted for e in after] == [e.drafted for e in before]
    assert len({e.drafted for e in after}) > 2  # cut short at several lengths, and whole chains
    assert [[d.token_id for d in e.drafts] for e in after] == [[d.token_id for d in e.drafts] for e in before]


def test_a_static_draft_with_a_dynamic_target_reads_its_drafts_back() -> None:
    pair = make_tiny_pair(seed=0, draft_noise=0.5, logit_scale=2.5)
    dynamic = ChatEngine(pair.target, pair.tokenizer, pair.draft, kv="dynamic")
    mixed = ChatEngine(pair.target, pair.tokenizer, pair.draft, kv="dynamic")
    mixed.draft = StaticLM(pair.draft)
    drafter = mixed.drafter("model")
    assert isinstance(drafter, ModelDrafter)
    drafter.lm = mixed.draft
    prompt = dynamic.prompt_ids([{"role": "user", "content": TEXT}])
    controls = Controls(gamma=4, drafter="model", max_new_tokens=40)
    draft = drafter.propose(prompt, 4, controls.sampling(), None)
    assert isinstance(draft, DeviceDraft)
    assert token_ids(mixed.stream_ids(prompt, controls)) == token_ids(dynamic.stream_ids(prompt, controls))


def test_the_cache_grows_past_its_first_capacity() -> None:
    pair = make_tiny_pair(seed=0, draft_noise=0.5, logit_scale=2.5)
    dynamic = ChatEngine(pair.target, pair.tokenizer, pair.draft, kv="dynamic")
    static = ChatEngine(pair.target, pair.tokenizer, pair.draft, kv="static")
    for lm in (static.target, static.draft):
        assert isinstance(lm, StaticLM)
        lm.capacity = 24  # the prompt alone is about 40 tokens
    prompt = dynamic.prompt_ids([{"role": "user", "content": TEXT}])
    controls = Controls(gamma=5, drafter="model", max_new_tokens=80)
    assert token_ids(static.stream_ids(prompt, controls)) == token_ids(dynamic.stream_ids(prompt, controls))
    assert isinstance(static.target, StaticLM) and static.target.capacity >= 64


def test_a_new_conversation_reuses_the_prefix_it_shares() -> None:
    _, static = engines(0)
    prompt = static.prompt_ids([{"role": "user", "content": TEXT}])
    controls = Controls(gamma=3, drafter="model", max_new_tokens=16)
    first = token_ids(static.stream_ids(prompt, controls))
    calls = static.target.forward_calls
    again = token_ids(static.stream_ids(prompt, controls))
    assert again == first
    other = static.prompt_ids([{"role": "user", "content": "a dog ran in the park"}])
    dynamic, _ = engines(0)
    assert token_ids(static.stream_ids(other, controls)) == token_ids(dynamic.stream_ids(other, controls))
    assert static.target.forward_calls > calls


# --- one host read per round ----------------------------------------------------------------


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("drafter", ["model", "ngram", "hybrid"])
def test_a_round_reads_the_device_once(temperature: float, drafter: str) -> None:
    _, static = engines(0)
    static._decoder.stop_ids = frozenset()  # no early end of the reply: six whole rounds
    prompt = static.prompt_ids([{"role": "user", "content": TEXT}])
    controls = Controls(gamma=4, drafter=drafter, max_new_tokens=40, temperature=temperature, seed=1)
    reply = static.start_ids(prompt, controls)  # the prefill reads nothing either, but is not a round
    with counted_host_reads() as reads:
        events = [e for _ in range(6) for e in reply.step()]
    rounds = sum(isinstance(e, RoundEvent) for e in events)
    assert rounds == 6 and not any(isinstance(e, SummaryEvent) for e in events)
    assert dict(reads) == {"tolist": rounds}


# --- sampling stays exact -------------------------------------------------------------------


@pytest.fixture(scope="module")
def small_static_engine() -> ChatEngine:
    tokenizer = make_tokenizer(VOCAB_CHARS)
    target = make_model(len(tokenizer), seed=3, hidden_size=32, logit_scale=1.5)
    draft = perturbed_copy(target, noise=1.5, seed=4)
    engine = ChatEngine(target, tokenizer, draft, kv="static")
    engine.stop_ids = frozenset()  # every token counts as an outcome, </s> included
    engine._decoder.stop_ids = frozenset()
    return engine


@pytest.mark.slow
def test_sampled_distribution_matches_target_on_the_static_path(
    small_static_engine: ChatEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Device drafts with the stop rule applied on the device (extra positions drafted, then
    ignored; the row after the last proposed one closes from p_target) sample exactly.
    (About 2.5 minutes on 2 shared cores: one case, the one with both kinds of round.)"""
    monkeypatch.setattr(small_static_engine.drafter("model"), "stop_below", 0.18)
    controls = Controls(drafter="model", gamma=3, temperature=1.0, max_new_tokens=8)
    rounds = [
        e
        for s in range(50)
        for e in small_static_engine.stream_ids(PROMPT, replace(controls, seed=s))
        if isinstance(e, RoundEvent)
    ]
    cut = Counter(e.drafted < e.gamma for e in rounds)
    assert cut[True] > 0 and cut[False] > 0, cut
    target = small_static_engine.target.model
    exact = exact_two_token_distribution(target, PROMPT, controls.sampling()).flatten()
    counts = sample_two_tokens(small_static_engine, PROMPT, controls)
    assert chi_square_p_value(counts, exact.double()) > ALPHA_LEVEL


# --- Gemma 3's sliding window ---------------------------------------------------------------


def tiny_gemma3(seed: int, vocab: int, noise: float = 0.0) -> Gemma3ForCausalLM:
    """A random Gemma 3 with a 6-token window on three of its four layers (``noise``: a draft of it)."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    config = Gemma3TextConfig(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        sliding_window=6,
        layer_types=["sliding_attention"] * 3 + ["full_attention"],
        max_position_embeddings=512,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    torch.manual_seed(seed)
    model = Gemma3ForCausalLM(config).eval()
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(3.0)
        for param in model.parameters():
            param.add_(torch.randn(param.shape, generator=generator) * noise * param.std())
    return model


def test_gemma3_rolls_back_past_its_window() -> None:
    """Rejections long after the 6-token window is full: transformers' dynamic cache refuses that
    rollback (it dropped the states), the static cache keeps every position and masks by window."""
    tokenizer = make_tokenizer()
    target = tiny_gemma3(0, len(tokenizer))
    draft = tiny_gemma3(0, len(tokenizer), noise=0.5)
    dynamic = ChatEngine(target, tokenizer, draft, kv="dynamic")
    auto = ChatEngine(target, tokenizer, draft)
    assert isinstance(auto.target, StaticLM)  # auto picks the static cache for sliding layers
    prompt = dynamic.prompt_ids([{"role": "user", "content": TEXT}])
    controls = Controls(gamma=4, drafter="model", max_new_tokens=60)
    for engine in (dynamic, auto):
        model_drafter(engine).stop_below = 0.0
    plain = token_ids(dynamic.stream_plain(prompt, controls))
    events = list(auto.stream_ids(prompt, controls))
    assert token_ids(events) == plain
    produced, rejected_at = 0, []
    for event in events:
        produced += isinstance(event, TokenEvent)
        if isinstance(event, RoundEvent) and event.accepted < event.drafted:
            rejected_at.append(produced)
    assert rejected_at and max(rejected_at) > 6 + 4  # well past the window
    with pytest.raises(RuntimeError, match="crop"):
        list(dynamic.stream_ids(prompt, controls))


def test_row_agreement_counts_every_verify_row() -> None:
    """What the self-test reports on a GPU, measured here on the CPU's static cache."""
    from specchat.engine.exact import row_agreement

    pair = make_tiny_pair(seed=0)
    agreement = row_agreement(StaticLM(pair.target), list(range(3, 30)))
    assert agreement.rows == sum(range(2, 10)) and agreement.argmax_differ == 0
    assert "verify rows on cpu" in agreement.line("cpu")
