"""CUDA placement and bitsandbytes 4-bit (run where a GPU is present; skipped elsewhere)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from specchat.models import load_model

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


def test_auto_picks_cuda_and_a_half_dtype(tiny_folders: tuple[Path, Path]) -> None:
    loaded = load_model(str(tiny_folders[0]))
    assert loaded.device.type == "cuda" and loaded.model.device.type == "cuda"
    assert loaded.dtype in (torch.bfloat16, torch.float16) and loaded.model.dtype == loaded.dtype


def test_4bit_target_on_cuda(tiny_folders: tuple[Path, Path]) -> None:
    pytest.importorskip("bitsandbytes")
    loaded = load_model(str(tiny_folders[0]), device="cuda", quant="4bit")
    assert type(loaded.model.model.layers[0].mlp.up_proj).__name__ == "Linear4bit"
    ids = torch.tensor([[1, 5, 9]], device=loaded.device)
    with torch.no_grad():
        assert torch.isfinite(loaded.model(ids).logits).all()
