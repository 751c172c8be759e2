"""The draft model ends a round where it is unsure of its own token (ModelDrafter.stop_below)."""

from __future__ import annotations

import torch

from specchat.engine.drafters import ModelDrafter
from specchat.engine.kv import CachedLM
from specchat.engine.sampling import SamplingParams, shape_probs
from specchat.testing import make_tiny_pair
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
