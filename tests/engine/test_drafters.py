"""The draft model ends a round where it is unsure of its own token (ModelDrafter.stop_below)."""

from __future__ import annotations

import torch

from specchat.engine.drafters import ModelDrafter
from specchat.engine.kv import CachedLM
from specchat.engine.sampling import SamplingParams, shape_probs
from specchat.testing.tiny_models import make_tiny_pair
from tests.typed import host_draft

PROMPT = [1, 5, 6, 7, 5, 6]


def drafter(stop_below: float) -> ModelDrafter:
    draft = CachedLM(make_tiny_pair(seed=2, logit_scale=2.0).draft)
    return ModelDrafter(draft, draft.vocab_width, stop_below=stop_below)


def top_probability_after(model: ModelDrafter, ids: list[int]) -> float:
    logits = CachedLM(model.lm.model).logits_after(ids, 1)
    return float(shape_probs(logits, SamplingParams()).max())


def test_without_a_threshold_the_draft_proposes_all_of_gamma() -> None:
    assert len(host_draft(drafter(0.0).propose(PROMPT, 5, SamplingParams(), None)).ids) == 5


def test_the_draft_stops_after_the_first_token_it_is_unsure_of() -> None:
    model = drafter(0.0)
    draft = host_draft(model.propose(PROMPT, 6, SamplingParams(), None))
    confidence = [top_probability_after(model, PROMPT + draft.ids[:i]) for i in range(6)]
    # Two tokens below it, wherever they fall; halfway between two confidences, since the draft's
    # own pass and this one's are not bit-identical on every CPU (a threshold equal to one of
    # them decided by rounding on a Sapphire Rapids VM).
    low = sorted(confidence)
    threshold = (low[1] + low[2]) / 2
    first_unsure = next(i for i, p in enumerate(confidence) if p < threshold)
    cut = host_draft(drafter(threshold).propose(PROMPT, 6, SamplingParams(), None))
    # The unsure token is still proposed (its verify row costs next to nothing); the next pass is not run.
    assert cut.ids == draft.ids[: first_unsure + 1]
    assert cut.p_draft.shape[0] == len(cut.ids)
    assert torch.equal(cut.p_draft, draft.p_draft[: len(cut.ids)])


def test_a_draft_never_sure_enough_proposes_one_token_per_round() -> None:
    draft = host_draft(drafter(1.01).propose(PROMPT, 4, SamplingParams(temperature=1.0), torch.Generator()))
    assert len(draft.ids) == 1


def test_the_draft_drafts_the_same_rows_whatever_its_cache_held_before() -> None:
    """The draft reads the prompt when it first drafts: a fresh cache reads all of it, one that
    drafted after it before (a reply replayed, or stepped after being streamed) reads one token.
    The rows it draws from must not depend on which (logits are not bit-identical across pass
    widths)."""
    prompt = [(7 * i) % 40 + 1 for i in range(240)]
    model = drafter(0.0)
    expected = host_draft(model.propose(prompt, 4, SamplingParams(), None))
    again = host_draft(model.propose(prompt, 4, SamplingParams(), None))
    assert again.ids == expected.ids
    assert torch.equal(again.p_draft, expected.p_draft)


LONG_PROMPT = [(7 * i) % 40 + 1 for i in range(240)]


def test_a_window_reads_only_the_last_tokens_then_reads_on_from_there() -> None:
    model = drafter(0.0)
    assert model.behind(LONG_PROMPT) == 240
    draft = host_draft(model.propose(LONG_PROMPT, 3, SamplingParams(), None, window=32))
    # The draft read the last 32 tokens, and drew exactly what a draft given only those draws.
    assert model.lm.cached_ids[:32] == LONG_PROMPT[-32:]
    alone = host_draft(drafter(0.0).propose(LONG_PROMPT[-32:], 3, SamplingParams(), None))
    assert draft.ids == alone.ids and torch.equal(draft.p_draft, alone.p_draft)
    # The next round reads on from the window's start: one or two tokens behind, not 240.
    after = LONG_PROMPT + draft.ids[:1] + [9]
    assert model.behind(after) <= 2
    host_draft(model.propose(after, 2, SamplingParams(), None))
    assert model.lm.cached_ids[: len(after) - 208] == after[208:]


def test_a_window_is_left_when_the_text_no_longer_holds_its_start() -> None:
    model = drafter(0.0)
    host_draft(model.propose(LONG_PROMPT, 2, SamplingParams(), None, window=32))
    other = [3, 4, *LONG_PROMPT[:100]]  # a new conversation
    assert model.behind(other) == len(other)  # read from its beginning again
    assert model.view(other) == other


def test_a_window_is_not_taken_by_a_draft_already_close_behind() -> None:
    model = drafter(0.0)
    host_draft(model.propose(LONG_PROMPT, 2, SamplingParams(), None))
    longer = [*LONG_PROMPT, 5, 6, 7]
    host_draft(model.propose(longer, 2, SamplingParams(), None, window=32))
    assert model.start == 0 and model.lm.cached_ids[:243] == longer
