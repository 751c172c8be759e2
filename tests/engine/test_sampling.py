"""The sampling maths, checked against the seed document's hand-worked numbers."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from specchat.engine import sampling as sampling_module
from specchat.engine.sampling import (
    DRAW_BLOCK,
    TOP_CHUNK,
    SamplingParams,
    acceptance_probability,
    argmax_rows,
    draw_rows,
    residual_distribution,
    shape_probs,
    top_entries,
    verify,
)
from specchat.errors import InvalidSettingError


def test_seed_worked_example_four_tokens() -> None:
    p_draft = torch.tensor([0.10, 0.60, 0.20, 0.10])
    p_target = torch.tensor([0.05, 0.30, 0.55, 0.10])
    assert acceptance_probability(p_target[1], p_draft[1]).item() == pytest.approx(0.5)
    assert residual_distribution(p_target, p_draft).tolist() == pytest.approx([0.0, 0.0, 1.0, 0.0])


def test_seed_exercise_three_tokens() -> None:
    p_draft = torch.tensor([0.2, 0.5, 0.3])
    p_target = torch.tensor([0.4, 0.2, 0.4])
    assert acceptance_probability(p_target[1], p_draft[1]).item() == pytest.approx(0.4)
    assert residual_distribution(p_target, p_draft).tolist() == pytest.approx([2 / 3, 0.0, 1 / 3])


def test_acceptance_is_capped_at_one() -> None:
    assert acceptance_probability(torch.tensor(0.9), torch.tensor(0.3)).item() == 1.0


def test_residual_that_sums_to_zero_falls_back_to_target() -> None:
    p = torch.tensor([[0.25, 0.25, 0.5]])
    assert residual_distribution(p, p.clone()).tolist() == [[0.25, 0.25, 0.5]]


def test_rejection_then_residual_reproduces_target_exactly() -> None:
    """Summing both paths of the rejection sampler gives p_target, token by token."""
    p_draft = torch.tensor([0.10, 0.60, 0.20, 0.10])
    p_target = torch.tensor([0.05, 0.30, 0.55, 0.10])
    accept = acceptance_probability(p_target, p_draft)
    rejected_mass = (p_draft * (1 - accept)).sum()
    emitted = p_draft * accept + rejected_mass * residual_distribution(p_target, p_draft)
    assert emitted.tolist() == pytest.approx(p_target.tolist())


def test_top_k_and_top_p_shape_and_renormalise() -> None:
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    top2 = shape_probs(logits, SamplingParams(temperature=1.0, top_k=2))
    assert top2[0].tolist() == pytest.approx([0.625, 0.375, 0.0, 0.0])
    nucleus = shape_probs(logits, SamplingParams(temperature=1.0, top_p=0.8))
    assert nucleus[0].tolist() == pytest.approx([0.625, 0.375, 0.0, 0.0])
    nucleus = shape_probs(logits, SamplingParams(temperature=1.0, top_p=0.81))
    assert nucleus[0].tolist() == pytest.approx([0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0.0])


def test_temperature_sharpens() -> None:
    logits = torch.tensor([[1.0, 0.0]])
    cold = shape_probs(logits, SamplingParams(temperature=0.5))[0, 0].item()
    warm = shape_probs(logits, SamplingParams(temperature=1.0))[0, 0].item()
    assert cold > warm


@pytest.mark.parametrize(
    "kwargs",
    [{"temperature": -0.1}, {"top_p": 0.0}, {"top_p": 1.5}, {"top_k": 0}],
)
def test_invalid_sampling_settings_are_rejected(kwargs: dict[str, Any]) -> None:
    with pytest.raises(InvalidSettingError):
        SamplingParams(**kwargs)


def test_greedy_verify_accepts_matching_prefix_and_corrects() -> None:
    p_target = torch.tensor([[0.1, 0.9, 0.0], [0.8, 0.1, 0.1], [0.2, 0.3, 0.5]])
    drafts = torch.tensor([1, 2])  # first matches argmax (1), second does not (argmax 0)
    p_draft = torch.nn.functional.one_hot(drafts, 3).float()
    verdict = verify(p_target, p_draft, drafts, SamplingParams(), None)
    assert verdict.accepted == 1
    assert verdict.next_token == 0
    assert verdict.p_target_next == pytest.approx(0.8)


def test_greedy_verify_all_accepted_takes_bonus_from_last_row() -> None:
    p_target = torch.tensor([[0.1, 0.9, 0.0], [0.8, 0.1, 0.1], [0.2, 0.3, 0.5]])
    drafts = torch.tensor([1, 0])
    p_draft = torch.nn.functional.one_hot(drafts, 3).float()
    verdict = verify(p_target, p_draft, drafts, SamplingParams(), None)
    assert (verdict.accepted, verdict.next_token) == (2, 2)


def test_sampled_verify_rejects_impossible_draft_and_uses_residual() -> None:
    p_target = torch.tensor([[0.0, 0.5, 0.5], [1.0, 0.0, 0.0]])
    drafts = torch.tensor([0])
    p_draft = torch.tensor([[0.8, 0.2, 0.0]])
    for seed in range(20):
        verdict = verify(
            p_target, p_draft, drafts, SamplingParams(temperature=1.0), torch.Generator().manual_seed(seed)
        )
        assert verdict.accepted == 0
        assert verdict.next_token in (1, 2)  # residual [0, 0.3, 0.5] normalised


def spread_row(width: int) -> torch.Tensor:
    """Unnormalised mass on a few ids either side of draw_rows' block edges, zero elsewhere."""
    row = torch.zeros(width)
    for token, mass in {
        3: 2.0,
        DRAW_BLOCK - 1: 1.0,
        DRAW_BLOCK: 3.0,
        2 * DRAW_BLOCK + 5: 0.5,
        width - 1: 1.5,
    }.items():
        row[token] = mass
    return row


def test_draw_rows_follows_each_rows_distribution_across_blocks() -> None:
    width = 3 * DRAW_BLOCK + 17
    rows = torch.stack([spread_row(width), spread_row(width).flip(0)])
    generator = torch.Generator().manual_seed(0)
    draws = torch.cat([draw_rows(rows, generator)[None] for _ in range(4000)])
    for r in range(2):
        counts = torch.bincount(draws[:, r], minlength=width).double()
        assert set(counts.nonzero().flatten().tolist()) == set(rows[r].nonzero().flatten().tolist())
        expected = rows[r].double() / rows[r].sum()
        observed = counts / counts.sum()
        assert torch.allclose(observed, expected, atol=0.03)  # 4000 draws: a few standard errors


def test_draw_rows_never_runs_past_the_last_token_with_mass(monkeypatch: pytest.MonkeyPatch) -> None:
    """Should rounding put the uniform at the very top of the running sum, the draw must still be
    a token of positive probability, not one of the zero-probability tokens after it."""
    rows = torch.zeros(2, 2 * DRAW_BLOCK + 3)
    rows[0, 7], rows[0, DRAW_BLOCK + 2] = 0.25, 0.75
    rows[1, 5] = 1.0
    monkeypatch.setattr(
        sampling_module.torch, "rand", lambda *shape, **kw: torch.ones(*shape, dtype=torch.float64)
    )
    assert draw_rows(rows, None).tolist() == [DRAW_BLOCK + 2, 5]


def test_sampled_verify_draws_the_bonus_from_the_target_at_t_above_0() -> None:
    p_target = torch.tensor([[0.0, 1.0, 0.0], [0.2, 0.0, 0.8]])
    drafts = torch.tensor([1])
    p_draft = torch.tensor([[0.0, 1.0, 0.0]])
    bonus = [
        verify(p_target, p_draft, drafts, SamplingParams(temperature=1.0), torch.Generator().manual_seed(s))
        for s in range(200)
    ]
    assert all(v.accepted == 1 and v.next_token in (0, 2) for v in bonus)
    assert 120 < sum(v.next_token == 2 for v in bonus) < 190


def test_argmax_rows_picks_what_torch_argmax_picks_first_of_equals_included() -> None:
    generator = torch.Generator().manual_seed(0)
    rows = torch.softmax(torch.randn(5, 151936, generator=generator) * 4, dim=-1)
    rows[1, [7, 90000]] = 1.0  # two equal maxima: the first one wins, as in torch
    rows[2] = 0.0  # all equal
    assert argmax_rows(rows).tolist() == rows.argmax(dim=-1).tolist()
    assert argmax_rows(rows).tolist()[1:3] == [7, 0]
    assert argmax_rows(rows[:, ::3]).tolist() == rows[:, ::3].argmax(dim=-1).tolist()  # a strided view
    assert argmax_rows(rows).dtype == torch.long
    assert argmax_rows(rows.bfloat16()).tolist() == rows.bfloat16().argmax(dim=-1).tolist()  # no numpy dtype


@pytest.mark.parametrize("scale", [0.5, 3.0, 30.0])
def test_top_entries_equal_torch_topk(scale: float) -> None:
    generator = torch.Generator().manual_seed(1)
    for _ in range(20):
        row = torch.softmax(torch.randn(151936, generator=generator) * scale, dim=-1)
        values, ids = top_entries(row, 5)
        expected = torch.topk(row, 5)
        assert torch.equal(values, expected.values)
        assert torch.equal(row[ids], expected.values)
        assert ids.dtype == torch.long


def test_top_entries_orders_equals_by_index_and_falls_back_on_flat_rows() -> None:
    row = torch.rand(40 * TOP_CHUNK, generator=torch.Generator().manual_seed(3)) * 0.5
    row[[30000, 17, 25000]] = 0.9  # three equal largest entries
    values, ids = top_entries(row, 5)
    assert ids.tolist()[:3] == [17, 25000, 30000]
    assert torch.equal(values, torch.topk(row, 5).values)
    flat = torch.zeros(40 * TOP_CHUNK)
    flat[[3000, 17]] = 0.5  # the floor is 0, so every entry is a candidate: torch.topk ranks them
    assert top_entries(flat, 5)[0].tolist() == [0.5, 0.5, 0.0, 0.0, 0.0]
    short = torch.tensor([0.1, 0.7, 0.2])
    assert top_entries(short, 5)[1].tolist() == [1, 2, 0]  # fewer entries than asked
    with_nan = torch.softmax(torch.randn(8 * TOP_CHUNK, generator=torch.Generator().manual_seed(2)), dim=-1)
    with_nan[5] = float("nan")
    assert top_entries(with_nan, 3)[0].shape == (3,)


@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_verifying_an_empty_draft_is_the_general_paths_answer_and_draw(temperature: float) -> None:
    """A plain round's shortcut gives what the general verification gives: token, trace and the
    generator's state after the draw."""
    params = SamplingParams(temperature=temperature)
    width = 5000
    for seed in range(20):
        logits = torch.randn(1, width, generator=torch.Generator().manual_seed(seed)) * 3
        p_target = shape_probs(logits, params)
        empty = torch.empty(0, dtype=torch.long), torch.empty(0, width)
        quick, general = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed)
        for own in (None, torch.empty(0)):
            shortcut = verify(p_target, empty[1], empty[0], params, quick, p_target_own=own)
            reference = sampling_module._verify_drafts(
                p_target, empty[1], empty[0], params, general, 5, own, None
            )
            assert shortcut == reference
            assert torch.equal(quick.get_state(), general.get_state())
