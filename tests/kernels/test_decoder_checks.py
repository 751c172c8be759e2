"""The C++ decoder's entry checks: sizes it cannot compute with become a Python error,
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


def test_the_engine_refuses_a_prompt_id_past_the_embedding_in_one_line() -> None:
    """A tokenizer may hold ids past the weights' rows (a special token transformers adds): the
    engine names the id before the decoder would refuse it mid-reply."""
    from transformers import AutoTokenizer

    from specchat.engine.backend import Controls
    from specchat.engine.session import ChatEngine
    from specchat.errors import InvalidSettingError
    from tests.kernels.decoder_abuse import FIXTURE

    tokenizer = AutoTokenizer.from_pretrained(str(FIXTURE.parent), gguf_file=FIXTURE.name)
    engine = ChatEngine(build(fresh()), tokenizer)
    assert engine.input_rows == 320
    with pytest.raises(InvalidSettingError, match="token id 320, and the model has embeddings for ids 0 to"):
        engine.start_ids([1, 320], Controls(drafter="none", max_new_tokens=2))
