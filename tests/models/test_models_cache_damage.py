"""A damaged cache is detected, rebuilt from what was verified, and said so; never loaded silently.

Every case runs the tiny packaged model through the path the real pair takes: chunks joined into
one GGUF (sha256 pinned), converted once to safetensors, loaded from the conversion.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from specchat.models import load_model
from specchat.models.cache.paths import CONVERTED_MARKER, converted_dir, gguf_dir
from specchat.models.names.catalog import PackagedModel
from specchat.models.records import LoadProgress

IDS = torch.tensor([[1, 5, 9, 20, 7, 3]])


def logits_of(name: str, events: list[LoadProgress] | None = None) -> torch.Tensor:
    loaded = load_model(name, device="cpu", progress=None if events is None else events.append)
    with torch.no_grad():
        return loaded.model(IDS).logits


def converted_folder(model: PackagedModel) -> Path:
    return converted_dir() / f"{model.name}-{model.key}"


def notices(events: list[LoadProgress]) -> list[str]:
    return [e.message for e in events if e.stage == "notice"]


def assert_no_partials() -> None:
    leftovers = [p for kind in (gguf_dir(), converted_dir()) if kind.is_dir() for p in kind.iterdir()]
    assert not [p for p in leftovers if ".partial-" in p.name]


def flip_byte(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


def test_altered_assembled_gguf_is_never_converted(tiny_packaged: PackagedModel) -> None:
    reference = logits_of(tiny_packaged.name)
    gguf = gguf_dir() / tiny_packaged.file
    original = gguf.read_bytes()
    # One byte inside the last tensor's data: the file stays a valid GGUF, with other weights.
    flip_byte(gguf, len(original) - 5)
    shutil.rmtree(converted_folder(tiny_packaged))  # the conversion is redone from the GGUF

    events: list[LoadProgress] = []
    again = logits_of(tiny_packaged.name, events)
    said = notices(events)
    assert len(said) == 1 and "damaged" in said[0] and "rebuilding it from the verified chunks" in said[0]
    assert tiny_packaged.file in said[0] and "\n" not in said[0]
    assert gguf.read_bytes() == original
    torch.testing.assert_close(again, reference, rtol=0, atol=0)
    assert_no_partials()


def test_broken_gguf_header_is_rebuilt(tiny_packaged: PackagedModel) -> None:
    reference = logits_of(tiny_packaged.name)
    gguf = gguf_dir() / tiny_packaged.file
    data = bytearray(gguf.read_bytes())
    data[4:8] = b"\xff\xff\xff\xff"  # the version field: transformers and gguf refuse the file
    gguf.write_bytes(bytes(data))
    shutil.rmtree(converted_folder(tiny_packaged))

    events: list[LoadProgress] = []
    torch.testing.assert_close(logits_of(tiny_packaged.name, events), reference, rtol=0, atol=0)
    assert any("rebuilding it from the verified chunks" in m for m in notices(events))


@pytest.mark.parametrize("keep", [0.5, 0.999, 0.0])
def test_truncated_converted_weights_are_rebuilt(tiny_packaged: PackagedModel, keep: float) -> None:
    reference = logits_of(tiny_packaged.name)
    weights = converted_folder(tiny_packaged) / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: int(len(data) * keep)])

    events: list[LoadProgress] = []
    torch.testing.assert_close(logits_of(tiny_packaged.name, events), reference, rtol=0, atol=0)
    said = notices(events)
    assert len(said) == 1 and "model.safetensors" in said[0] and "rebuilding" in said[0]
    assert weights.stat().st_size == len(data)
    assert_no_partials()
    # Rebuilt once: the next start is quiet again.
    quiet: list[LoadProgress] = []
    logits_of(tiny_packaged.name, quiet)
    assert notices(quiet) == [] and not [e for e in quiet if e.stage == "convert"]


def test_altered_converted_header_is_rebuilt(tiny_packaged: PackagedModel) -> None:
    reference = logits_of(tiny_packaged.name)
    weights = converted_folder(tiny_packaged) / "model.safetensors"
    data = weights.read_bytes()
    header = data.index(b'"F32"')  # a dtype in the JSON header: F32 -> F16 halves every tensor
    weights.write_bytes(data[:header] + b'"F16"' + data[header + 5 :])

    events: list[LoadProgress] = []
    torch.testing.assert_close(logits_of(tiny_packaged.name, events), reference, rtol=0, atol=0)
    assert any("model.safetensors" in m and "rebuilding" in m for m in notices(events))


def test_missing_converted_file_is_rebuilt(tiny_packaged: PackagedModel) -> None:
    reference = logits_of(tiny_packaged.name)
    (converted_folder(tiny_packaged) / "tokenizer.json").unlink()
    events: list[LoadProgress] = []
    torch.testing.assert_close(logits_of(tiny_packaged.name, events), reference, rtol=0, atol=0)
    assert any("tokenizer.json" in m for m in notices(events))


def test_unreadable_record_is_rebuilt(tiny_packaged: PackagedModel) -> None:
    reference = logits_of(tiny_packaged.name)
    (converted_folder(tiny_packaged) / CONVERTED_MARKER).write_text("{not json")
    events: list[LoadProgress] = []
    torch.testing.assert_close(logits_of(tiny_packaged.name, events), reference, rtol=0, atol=0)
    assert any(CONVERTED_MARKER in m for m in notices(events))


def test_users_own_gguf_conversion_is_rebuilt_from_it(tiny_gguf: Path, tmp_path: Path) -> None:
    gguf = tmp_path / "mine.gguf"
    shutil.copy(tiny_gguf, gguf)
    first = load_model(str(gguf), device="cpu")
    with torch.no_grad():
        reference = first.model(IDS).logits
    weights = Path(first.source) / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])

    events: list[LoadProgress] = []
    again = load_model(str(gguf), device="cpu", progress=events.append)
    with torch.no_grad():
        torch.testing.assert_close(again.model(IDS).logits, reference, rtol=0, atol=0)
    assert any(f"rebuilding it from {gguf.resolve()}" in m for m in notices(events))


@pytest.mark.parametrize("damage", ["altered", "truncated"])
def test_damaged_chunk_is_one_line_naming_the_reinstall(
    tiny_packaged: PackagedModel, tmp_path: Path, damage: str
) -> None:
    from specchat.errors import ModelLoadError

    chunk = tmp_path / "site-packages" / "tiny_packaged_part2" / "data" / "part02.bin"
    if damage == "altered":
        flip_byte(chunk, 10)
    else:
        chunk.write_bytes(chunk.read_bytes()[:-1])
    with pytest.raises(ModelLoadError) as err:
        load_model(tiny_packaged.name, device="cpu")
    message = str(err.value)
    assert "corrupt" in message and "--force-reinstall" in message and "\n" not in message
    assert not converted_dir().exists() or not any(converted_dir().iterdir())
    assert not (gguf_dir() / tiny_packaged.file).exists()
    assert_no_partials()


def test_record_lists_every_file_with_its_size_and_checksums(tiny_packaged: PackagedModel) -> None:
    logits_of(tiny_packaged.name)
    folder = converted_folder(tiny_packaged)
    record = json.loads((folder / CONVERTED_MARKER).read_text())
    on_disk = {p.name: p.stat().st_size for p in folder.iterdir() if p.name != CONVERTED_MARKER}
    assert {name: entry["size"] for name, entry in record["files"].items()} == on_disk
    assert all(len(entry["sha256"]) == 64 and len(entry["head"]) == 64 for entry in record["files"].values())


def _drop_record_of_files(folder: Path) -> None:
    """As a conversion written before sizes and checksums were recorded."""
    record = json.loads((folder / CONVERTED_MARKER).read_text())
    del record["files"]
    (folder / CONVERTED_MARKER).write_text(json.dumps(record))


def test_an_older_conversion_is_kept_when_sound_and_rebuilt_when_cut(tiny_packaged: PackagedModel) -> None:
    reference = logits_of(tiny_packaged.name)
    folder = converted_folder(tiny_packaged)
    _drop_record_of_files(folder)
    quiet: list[LoadProgress] = []
    logits_of(tiny_packaged.name, quiet)
    assert notices(quiet) == [] and "convert" not in {e.stage for e in quiet}  # no needless minutes

    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    events: list[LoadProgress] = []
    torch.testing.assert_close(logits_of(tiny_packaged.name, events), reference, rtol=0, atol=0)
    said = notices(events)
    assert len(said) == 1 and "model.safetensors has" in said[0] and "where its header describes" in said[0]
    assert "files" in json.loads((folder / CONVERTED_MARKER).read_text())  # recorded this time


def test_a_conversion_named_directly_is_rebuilt_while_its_gguf_is_there(
    tiny_gguf: Path, tmp_path: Path
) -> None:
    from specchat.errors import ModelLoadError

    gguf = tmp_path / "mine.gguf"
    shutil.copy(tiny_gguf, gguf)
    folder = Path(load_model(str(gguf), device="cpu").source)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:500])
    events: list[LoadProgress] = []
    load_model(folder.name, device="cpu", progress=events.append)  # the name `specchat models` lists
    assert any(f"rebuilding it from {gguf.resolve()}" in m for m in notices(events))

    weights.write_bytes(weights.read_bytes()[:500])
    gguf.unlink()
    with pytest.raises(ModelLoadError) as err:
        load_model(folder.name, device="cpu")
    message = str(err.value)
    assert f"`specchat models --clear {folder.name}`" in message and "is gone or has changed" in message
    assert "\n" not in message
