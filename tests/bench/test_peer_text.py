"""The greedy-text comparison with llama.cpp: where two replies part, and whether a near tie explains it."""

from __future__ import annotations

import math
from dataclasses import replace

import torch

from specchat.bench.peer_text import compare, their_log_probs
from specchat.engine.compare import first_difference


def log_probs(rows: list[dict[int, float]], vocab: int = 6) -> torch.Tensor:
    table = torch.full((len(rows), vocab), -20.0)
    for i, row in enumerate(rows):
        for token, value in row.items():
            table[i, token] = value
    return table


def test_replies_part_at_the_first_different_token_or_where_one_ends() -> None:
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 4, 3]) == 1
    assert first_difference([1, 2], [1, 2, 3]) == 2


def test_llama_cpp_log_probabilities_are_placed_by_token() -> None:
    def row(
        token: int, raw: list[int], *others: tuple[int, float], own: list[int] | None = None
    ) -> dict[str, object]:
        top = [{"id": token, "logprob": -0.1, "bytes": own or raw}]
        top += [{"id": i, "logprob": p, "bytes": [0]} for i, p in others]
        return {"id": token, "bytes": raw, "top_logprobs": top}

    rows = [row(3, [97], (5, -2.5)), row(8, [226, 130, 172], own=[172]), row(9, [98])]
    data = {"tokens": [3, 7, 8, 9], "completion_probabilities": rows}
    # Tokens 7 and 8 split one UTF-8 character: the server's row for them names 8 with both
    # tokens' bytes, so neither position takes it, and 9's row lands on 9, not one too early.
    assert their_log_probs(data) == {0: {3: -0.1, 5: -2.5}, 3: {9: -0.1}}
    assert their_log_probs({}) == {}


def test_a_near_tie_within_the_programs_disagreement_explains_a_parting() -> None:
    ours, theirs = [1, 2, 3], [1, 2, 4]
    mine = log_probs([{1: -0.5}, {2: -1.0}, {3: -0.70, 4: -0.75}])
    other = {0: {1: -0.6}, 1: {2: -1.2}, 2: {4: -0.69, 3: -0.72}}
    result = compare("p", ours, theirs, mine, other, (10.0, 9.0))
    assert result.diverge_at == 2
    assert math.isclose(result.our_margin or 0, 0.05, abs_tol=1e-6)
    assert math.isclose(result.their_margin or 0, 0.03, abs_tol=1e-6)
    assert math.isclose(result.disagreement, 0.2, abs_tol=1e-6)
    assert result.explained(result.disagreement)
    assert not result.explained(0.04)  # a margin past the programs' disagreement is a bug to chase


def test_a_token_llama_cpp_did_not_even_rank_is_not_explained() -> None:
    mine = log_probs([{1: -0.1, 2: -3.0}])
    result = compare("p", [1], [2], mine, {0: {2: -0.1}}, (1.0, 1.0))
    assert result.their_margin is None and not result.explained(10.0)


def test_a_parting_where_the_float_model_prefers_specchats_token_is_explained() -> None:
    """llama.cpp's own arithmetic turned there: the float model on the same weights sides with specchat."""
    mine = log_probs([{1: -0.1, 2: -0.2}])
    result = compare("p", [1], [2], mine, {0: {2: -0.1, 1: -0.9}}, (1.0, 1.0))
    assert not result.explained(0.2)  # llama.cpp's margin 0.8 is past any disagreement
    assert replace(result, float_margin=0.26).explained(0.2)
    assert not replace(result, float_margin=-0.5).explained(0.2)
