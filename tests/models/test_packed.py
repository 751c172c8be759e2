"""The packed cache: a model packed once for the CPU kernels, memory-mapped after, rebuilt if damaged."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from specchat.kernels import cpu_supports
from specchat.kernels.native import from_hf
from specchat.models.packed import WEIGHTS, PackRecipe, is_packed, load_native, packed_dir
from specchat.models.records import LoadProgress
from specchat.testing import TinyPair

pytestmark = pytest.mark.skipif(cpu_supports() is not None, reason=f"specchat's kernels: {cpu_supports()}")
IDS = torch.tensor([[1, 5, 9, 12, 7, 30, 22, 4, 8, 3]])


def logits(model: object, ids: torch.Tensor = IDS) -> torch.Tensor:
    return model(ids, None, logits_to_keep=ids.shape[1]).logits[0]  # type: ignore[operator]


def test_a_folder_is_packed_once_then_loaded_from_the_cache(tiny_folders: tuple[Path, Path]) -> None:
    events: list[LoadProgress] = []
    first = load_native(str(tiny_folders[0]), PackRecipe("q8"), events.append)
    assert first.name == "tiny-target" and any("packing" in e.message for e in events)
    folders = list(packed_dir().iterdir())
    assert len(folders) == 1 and is_packed(folders[0])
    events.clear()
    again = load_native(str(tiny_folders[0]), PackRecipe("q8"), events.append)
    assert not any("packing" in e.message for e in events)
    assert torch.equal(logits(first.model), logits(again.model))
    assert first.tokenizer.decode([5, 9]) == "cg"  # the tokenizer came along


def test_a_gguf_is_packed_from_its_blocks(tiny_pair: TinyPair, tiny_gguf: Path) -> None:
    """A llama GGUF (q/k rows permuted by llama.cpp's converter) gives the float model's forward."""
    model = load_native(str(tiny_gguf), PackRecipe("gguf")).model
    reference = from_hf(tiny_pair.target, bits=8)  # F32 tensors in the GGUF: both quantize to q8
    assert torch.equal(logits(model), logits(reference))


def test_damaged_weights_are_packed_again_and_said_so(tiny_folders: tuple[Path, Path]) -> None:
    model = load_native(str(tiny_folders[0]), PackRecipe("q4")).model
    expected = logits(model)
    del model
    weights = next(packed_dir().iterdir()) / WEIGHTS
    weights.write_bytes(weights.read_bytes()[:-100])  # truncated, as by a full disk or a crash
    events: list[LoadProgress] = []
    again = load_native(str(tiny_folders[0]), PackRecipe("q4"), events.append)
    assert any("damaged" in e.message and "packing it again" in e.message for e in events)
    assert torch.equal(logits(again.model), expected)


def test_recipes_are_kept_apart(tiny_folders: tuple[Path, Path]) -> None:
    load_native(str(tiny_folders[1]), PackRecipe("q4", 40))
    load_native(str(tiny_folders[1]), PackRecipe("q4"))
    names = sorted(p.name for p in packed_dir().iterdir())
    assert len(names) == 2 and any("+head40" in n for n in names)


def test_a_draft_with_the_same_vocabulary_reuses_the_targets_tokenizer(
    tiny_folders: tuple[Path, Path],
) -> None:
    target = load_native(str(tiny_folders[0]), PackRecipe("q8"))
    draft = load_native(str(tiny_folders[1]), PackRecipe("q4"), share_tokenizer=target)
    assert draft.tokenizer is target.tokenizer
