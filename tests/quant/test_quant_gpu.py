"""The exactness checks on CUDA: bf16 (the GPU default) and a bitsandbytes 4-bit target.

Skipped without CUDA; on a GPU machine `python -m pytest -m gpu` runs them (the device probe,
scripts/gpu_probe.py, runs the ones that need no TUI package).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from specchat.engine import sampling
from specchat.engine.backend import Controls
from specchat.engine.events import SummaryEvent
from specchat.engine.exact import use_exact_kernels
from specchat.engine.session import ChatEngine
from specchat.models import load_model
from specchat.models.records import LoadedModel
from tests.engine.test_exactness import ALPHA_LEVEL, chi_square_p_value, sample_two_tokens
from tests.quant.checks import CONTEXT, WIDTHS, exact_by_one_token_passes, row_mismatch, token_ids

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

TARGETS = ["bf16", "4bit"]


@pytest.fixture(autouse=True)
def stock_softmax_afterwards() -> Iterator[None]:
    yield
    sampling.use_cuda_softmax(None)


def cuda_pair(folders: tuple[Path, Path], target: str) -> tuple[LoadedModel, LoadedModel]:
    """The pair on CUDA with the target in exact mode: the claims below are exact mode's (the fast
    default mode's rows are measured by scripts/gpu_probe.py, not promised)."""
    if target == "4bit":
        pytest.importorskip("bitsandbytes", reason="bitsandbytes is not installed (the gpu extra)")
    loaded = load_model(str(folders[0]), device="cuda", quant="4bit" if target == "4bit" else None)
    assert loaded.dtype == torch.bfloat16 or not torch.cuda.is_bf16_supported()
    use_exact_kernels(loaded.model)
    return loaded, load_model(str(folders[1]), device="cuda")


@pytest.mark.parametrize("target", TARGETS)
def test_cuda_verify_rows_equal_one_token_passes(quant_folders: tuple[Path, Path], target: str) -> None:
    model = cuda_pair(quant_folders, target)[0].model
    mismatch = {width: row_mismatch(model, CONTEXT, width) for width in WIDTHS}
    assert all(value == 0.0 for value in mismatch.values()), mismatch


@pytest.mark.parametrize("target", TARGETS)
def test_cuda_greedy_speculative_equals_plain(quant_folders: tuple[Path, Path], target: str) -> None:
    loaded, draft = cuda_pair(quant_folders, target)
    engine = ChatEngine(loaded.model, loaded.tokenizer, draft.model)
    prompt = engine.prompt_ids([{"role": "user", "content": "the cat sat on the mat. the cat sat on"}])
    for drafter in ("model", "hybrid"):
        controls = Controls(gamma=4, drafter=drafter, schedule="fixed", max_new_tokens=48)
        plain = token_ids(engine.stream_plain(prompt, controls))
        speculative = list(engine.stream_ids(prompt, controls))
        assert token_ids(speculative) == plain, drafter
        summary = speculative[-1]
        assert isinstance(summary, SummaryEvent) and summary.drafted > 0


@pytest.mark.parametrize("target", TARGETS)
def test_cuda_sampled_distribution_matches_target(
    small_vocab_folders: tuple[Path, Path], target: str
) -> None:
    loaded, draft = cuda_pair(small_vocab_folders, target)
    engine = ChatEngine(loaded.model, loaded.tokenizer, draft.model)
    engine.stop_ids = frozenset()  # every token counts as an outcome, </s> included
    engine._decoder.stop_ids = frozenset()
    controls = Controls(drafter="model", gamma=3, temperature=1.0, max_new_tokens=8)
    prompt = [1, 3, 4, 3, 4, 3]
    exact = exact_by_one_token_passes(loaded.model, prompt, controls.sampling()).flatten()
    counts = sample_two_tokens(engine, prompt, controls)
    assert chi_square_p_value(counts, exact.double()) > ALPHA_LEVEL
