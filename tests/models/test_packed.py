"""The packed cache: a model packed once for the CPU kernels, memory-mapped after, rebuilt if damaged."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from specchat.kernels import cpu_supports
from specchat.models.cache.paths import CONVERTED_MARKER
from specchat.models.compute.packed import load_native
from specchat.models.compute.packed_cache import (
    FORMAT_VERSION,
    WEIGHTS,
    PackRecipe,
    is_packed,
    load_tokenizer,
    packed_dir,
)
from specchat.models.compute.packing import from_hf
from specchat.models.records import LoadProgress
from specchat.testing.tiny_models import TinyPair

pytestmark = pytest.mark.skipif(cpu_supports() is not None, reason=f"specchat's kernels: {cpu_supports()}")
IDS = torch.tensor([[1, 5, 9, 12, 7, 30, 22, 4, 8, 3]])


def logits(model: Callable[..., Any], ids: torch.Tensor = IDS) -> torch.Tensor:
    return model(ids, None, logits_to_keep=ids.shape[1]).logits[0]


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
    as_q8 = load_native(str(tiny_gguf), PackRecipe("q8")).model
    reference = from_hf(tiny_pair.target, bits=8)  # F32 tensors in the GGUF: both quantize to q8
    assert torch.equal(logits(as_q8), logits(reference))
    kept = load_native(str(tiny_gguf), PackRecipe("gguf")).model  # the F32 weights as they are
    with torch.inference_mode():
        expected = tiny_pair.target(input_ids=IDS).logits[0]
    assert torch.allclose(logits(kept), expected, atol=1e-4)


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


def test_copies_packed_by_an_earlier_format_are_removed_once_repacked(
    tiny_folders: tuple[Path, Path],
) -> None:
    """A format change repacks every model; the copies it supersedes would only hold disk."""
    packed_dir().mkdir(parents=True, exist_ok=True)

    def copy(name: str, version: int) -> Path:
        folder = packed_dir() / name
        folder.mkdir()
        (folder / WEIGHTS).write_bytes(b"x" * 1000)
        (folder / CONVERTED_MARKER).write_text(json.dumps({"format": version, "files": {}}))
        return folder

    earlier = copy("tiny-target-q8-0123456789ab", FORMAT_VERSION - 1)
    current = copy("tiny-target-q8-ba9876543210", FORMAT_VERSION)  # same name, another source
    other_recipe = copy("tiny-target-q4-0123456789ab", FORMAT_VERSION - 1)
    events: list[LoadProgress] = []
    loaded = load_native(str(tiny_folders[0]), PackRecipe("q8"), events.append)
    assert not earlier.exists() and current.exists() and other_recipe.exists() and loaded.folder.exists()
    assert [e.message for e in events if "removed" in e.message] == [
        "removed the copy of tiny-target packed by an earlier specchat (1.0 KB)"  # weights and record
    ]


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


class Quit(BaseException):
    """What the app's progress callback raises when the user quits mid-load."""


@pytest.mark.parametrize("source", ["gguf", "folder"])
def test_packing_reports_each_layer_and_stops_when_the_callback_gives_up(
    source: str, tiny_gguf: Path, tiny_folders: tuple[Path, Path]
) -> None:
    """Quitting during the one-time packing must not wait for the whole model to be packed."""
    spec, recipe = (
        (str(tiny_gguf), PackRecipe("gguf")) if source == "gguf" else (str(tiny_folders[0]), PackRecipe("q4"))
    )
    layers: list[str] = []

    def progress(event: LoadProgress) -> None:
        if ": layer " in event.message:
            layers.append(event.message)
            raise Quit

    with pytest.raises(Quit):
        load_native(spec, recipe, progress)
    assert len(layers) == 1 and layers[0].endswith("layer 1/2")
    assert not any(is_packed(p) for p in packed_dir().glob("*"))  # nothing half-packed is kept


TEXTS = ["cab", "  a\tb\nc ", "", "<s>abc</s>", "zzz yyy", "é日🙂"]
MESSAGES = [
    {"role": "user", "content": "abc"},
    {"role": "assistant", "content": "d"},
    {"role": "user", "content": "e"},
]


def assert_same_tokenizer(fast: Any, reference: Any) -> None:
    """Everything the engine asks of a tokenizer agrees between the two."""
    for text in TEXTS:
        ids = reference(text)["input_ids"]
        assert fast(text)["input_ids"] == ids, text
        options = {"skip_special_tokens": False, "clean_up_tokenization_spaces": False}
        assert fast.decode(ids, **options) == reference.decode(ids, **options)
    template = {"tokenize": False, "add_generation_prompt": True}
    assert fast.apply_chat_template(MESSAGES, **template) == reference.apply_chat_template(
        MESSAGES, **template
    )
    for name in ("eos_token_id", "bos_token_id", "pad_token_id", "unk_token_id", "all_special_ids"):
        assert getattr(fast, name) == getattr(reference, name), name
    assert fast.get_vocab() == reference.get_vocab()
    specials = {i: t.special for i, t in reference.added_tokens_decoder.items()}
    assert {i: t.special for i, t in fast.added_tokens_decoder.items()} == specials


def test_the_tokenizer_read_straight_from_its_file_is_autotokenizers(tiny_folders: tuple[Path, Path]) -> None:
    from transformers import AutoTokenizer

    folder = load_native(str(tiny_folders[0]), PackRecipe("q8")).folder
    fast = load_tokenizer(folder)
    assert type(fast).__name__ != "function" and fast.chat_template
    assert_same_tokenizer(fast, AutoTokenizer.from_pretrained(str(folder)))


def test_an_older_tokenizer_layout_goes_through_autotokenizer(
    tiny_folders: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    import json

    from transformers import AutoTokenizer

    folder = load_native(str(tiny_folders[0]), PackRecipe("q8")).folder
    reference = AutoTokenizer.from_pretrained(str(folder))
    (folder / "special_tokens_map.json").write_text(json.dumps({"eos_token": "</s>", "bos_token": "<s>"}))
    calls: list[str] = []
    original = AutoTokenizer.from_pretrained

    def recording(path: str) -> Any:
        calls.append(path)
        return original(path)

    monkeypatch.setattr(AutoTokenizer, "from_pretrained", recording)
    assert_same_tokenizer(load_tokenizer(folder), reference)
    assert calls == [str(folder)]


@pytest.mark.parametrize("rows_at_a_time", [16, 4096])
def test_a_gguf_streamed_into_the_cache_holds_what_packing_in_memory_gives(
    tiny_gguf: Path, monkeypatch: pytest.MonkeyPatch, rows_at_a_time: int
) -> None:
    """Packing a range of rows at a time, written straight into the file (64-byte aligned, the
    gaps held by pad tensors), gives every array a whole-model packing in memory gives."""
    import specchat.models.compute.packing as packing
    from specchat.models.compute.packed_cache import mapped_weights
    from specchat.models.compute.packed_stream import ALIGN

    monkeypatch.setattr(packing, "PACK_ROWS", rows_at_a_time)  # the tiny vocabulary is 3+ ranges of 16
    folder = load_native(str(tiny_gguf), PackRecipe("gguf")).folder
    streamed = mapped_weights(folder / WEIGHTS)
    whole = packing.pack_gguf(str(tiny_gguf), mode="gguf")
    assert streamed.meta() == whole.meta()
    assert streamed.tensors.keys() == whole.tensors.keys()
    for name, tensor in whole.tensors.items():
        assert torch.equal(streamed.tensors[name], tensor), name
        assert streamed.tensors[name].data_ptr() % ALIGN == 0, name


def test_a_packing_stopped_midway_leaves_no_copy_and_the_next_start_packs(tiny_gguf: Path) -> None:
    def give_up(event: LoadProgress) -> None:
        if event.stage == "kernels" and "layer 1/" in event.message:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        load_native(str(tiny_gguf), PackRecipe("gguf"), give_up)
    assert not [f for f in packed_dir().iterdir() if is_packed(f)]
    assert not [f for f in packed_dir().iterdir() if f.name.startswith(".")], "the partial file is removed"
    events: list[LoadProgress] = []
    load_native(str(tiny_gguf), PackRecipe("gguf"), events.append)
    assert any("packed" in e.message for e in events)


def test_packing_says_the_time_left_once_two_layers_give_a_rate(monkeypatch: pytest.MonkeyPatch) -> None:
    import specchat.models.compute.packed as packed

    clock = iter([100.0, 130.0])  # layer 1 done at 100 s, layer 2 at 130 s: 30 s a layer
    monkeypatch.setattr(packed.time, "monotonic", lambda: next(clock, 200.0))
    events: list[LoadProgress] = []
    report = packed._layer_progress("m", PackRecipe("gguf"), events.append)
    report(1, 4)
    report(2, 4)
    assert [e.message for e in events] == [
        "packing m (gguf), once: layer 1/4",
        "packing m (gguf), once: layer 2/4, about 1 min 0 s left",
    ]
    assert packed.time_left(42.4) == "42 s"


@pytest.mark.parametrize(
    "fixture", ["llama-Q4_K.gguf", "qwen2-Q5_0.gguf", "gemma3-Q8_0.gguf", "llama-BF16.gguf"]
)
def test_native_packing_gives_numpys_packed_model(fixture: str) -> None:
    """The native repacking, q and k of a Llama unpermuted through its row order included, packs
    every array numpy packs, to the byte."""
    from specchat.models.compute.packing import pack_gguf

    path = Path(__file__).parents[1] / "fixtures" / "gguf" / fixture
    native, reference = pack_gguf(str(path), native=True), pack_gguf(str(path), native=False)
    assert native.meta() == reference.meta()
    assert native.tensors.keys() == reference.tensors.keys()
    for name, tensor in reference.tensors.items():
        assert torch.equal(native.tensors[name].view(torch.uint8), tensor.view(torch.uint8)), name


def test_a_failed_write_of_the_packed_file_is_raised_to_the_packing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The file is written on a thread of its own: a full disk there still ends the packing."""
    import errno
    import os

    import numpy as np

    from specchat.models.compute import packed_stream

    def full(*_: Any) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(packed_stream.os, "pwrite", full)
    with (
        pytest.raises(OSError, match="No space"),
        packed_stream.StreamedSafetensors(tmp_path / "w", 4096) as w,
    ):
        for i in range(3):
            w.add(f"t{i}", np.zeros((16, 16), dtype=np.uint8))
        w.close({})
    assert os.path.exists(tmp_path / "w")


def test_a_stop_while_a_range_is_being_written_ends_the_writing_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Packing given up midway stops the writer without draining while it may be writing a range:
    the stop's sentinel must outlive that range's bookkeeping, or the stop waits forever."""
    import os
    import threading

    import numpy as np

    from specchat.models.compute import packed_stream

    writing, release = threading.Event(), threading.Event()
    pwrite = os.pwrite

    def slow_pwrite(fd: int, data: memoryview, at: int) -> int:
        writing.set()
        release.wait(10)
        return pwrite(fd, data, at)

    monkeypatch.setattr(packed_stream.os, "pwrite", slow_pwrite)
    stream = packed_stream.StreamedSafetensors(tmp_path / "w", 4096)
    stream.add("t", np.zeros((16, 16), dtype=np.uint8))
    assert writing.wait(10)
    stopper = threading.Thread(target=stream.__exit__, args=(KeyboardInterrupt, None, None), daemon=True)
    stopper.start()
    while stopper.is_alive() and list(stream._pending) != [None]:  # the stop has cleared and handed None
        threading.Event().wait(0.01)
    release.set()
    stopper.join(10)
    assert not stopper.is_alive(), "the stop never returned: the writer lost its None"
