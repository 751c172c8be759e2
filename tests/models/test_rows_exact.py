"""Every CPU path computes a verify pass's rows as one-token passes do (the stock fp32 one too)."""

from __future__ import annotations

import pytest

from specchat.models.compute.cpu_quant import prepare_cpu_pair
from specchat.testing.tiny_models import make_model, make_tokenizer
from tests.quant.checks import CONTEXT, WIDTHS, row_mismatch


@pytest.mark.parametrize("path", ["none", "int8/dyn8", "q8/q4"])
def test_verify_rows_equal_one_token_rows(path: str) -> None:
    from specchat.kernels import cpu_supports

    if path.startswith("q") and cpu_supports() is not None:
        pytest.skip(f"specchat's kernels: {cpu_supports()}")
    target = make_model(len(make_tokenizer()), seed=7, hidden_size=64, layers=2, logit_scale=3.0)
    pair = prepare_cpu_pair(target, None, path)
    assert [row_mismatch(pair.target, CONTEXT, width) for width in WIDTHS] == [0.0] * len(WIDTHS)
