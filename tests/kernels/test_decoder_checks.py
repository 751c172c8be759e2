"""The C++ decoder's entry checks (issue 30): sizes it cannot compute with become a Python error,
whatever a caller hands it, never a read or write past a buffer."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from tests.kernels.decoder_abuse import ABUSES, build, fresh


@pytest.mark.parametrize("abuse", list(ABUSES.values()), ids=list(ABUSES))
def test_the_decoder_refuses_sizes_it_cannot_compute_with(abuse: Callable[[], Any]) -> None:
    with pytest.raises((ValueError, RuntimeError)):
        abuse()


def test_a_valid_model_passes_its_checks_and_runs() -> None:
    model = build(fresh())
    logits = model(torch.tensor([[1, 5, 9]]), None, logits_to_keep=3).logits
    assert logits.shape == (1, 3, 320) and torch.isfinite(logits).all()
