"""Resolving what the user typed: packaged names, folders, GGUF files, cache entries, hub ids."""

from __future__ import annotations

from pathlib import Path

import pytest

from specchat.errors import ModelLoadError, ModelNotFoundError
from specchat.models.cache.paths import CONVERTED_MARKER, converted_dir
from specchat.models.names.catalog import DEFAULT_DRAFT, DEFAULT_TARGET, PACKAGED
from specchat.models.names.resolve import resolve_spec


def assert_one_line(err: pytest.ExceptionInfo[Exception]) -> str:
    message = str(err.value)
    assert message and "\n" not in message
    return message


def test_packaged_names_resolve_without_touching_disk() -> None:
    for name in PACKAGED:
        resolved = resolve_spec(name)
        assert (resolved.kind, resolved.name, resolved.packaged) == ("packaged", name, PACKAGED[name])
    assert DEFAULT_TARGET in PACKAGED and DEFAULT_DRAFT in PACKAGED


def test_unknown_name_lists_packaged_models_and_suggests_specchat_models() -> None:
    with pytest.raises(ModelNotFoundError) as err:
        resolve_spec("qwen-coder-7b")
    message = assert_one_line(err)
    assert "qwen-coder-7b" in message and "specchat models" in message
    assert all(name in message for name in PACKAGED)


@pytest.mark.parametrize("spec", ["./no/such/folder", "/no/such/model.gguf", "models/x.gguf", "~/nope/a/b"])
def test_missing_path_says_it_does_not_exist(spec: str) -> None:
    with pytest.raises(ModelNotFoundError) as err:
        resolve_spec(spec)
    assert "does not exist" in assert_one_line(err)


def test_empty_spec() -> None:
    with pytest.raises(ModelNotFoundError):
        resolve_spec("  ")


def test_hub_like_id_resolves_to_hub_without_network() -> None:
    resolved = resolve_spec("Qwen/Qwen2.5-0.5B-Instruct")
    assert (resolved.kind, resolved.location) == ("hub", "Qwen/Qwen2.5-0.5B-Instruct")


def test_folder_with_config_is_a_folder(tiny_folders: tuple[Path, Path]) -> None:
    resolved = resolve_spec(str(tiny_folders[0]))
    assert (resolved.kind, resolved.name) == ("folder", "tiny-target")


def test_gguf_file_and_folder_with_one_gguf(tmp_path: Path) -> None:
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    assert resolve_spec(str(gguf)).kind == "gguf"
    resolved = resolve_spec(str(tmp_path))
    assert (resolved.kind, resolved.name, resolved.location) == ("gguf", "m", str(gguf.resolve()))


def test_folder_without_model_is_a_load_error(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError) as err:
        resolve_spec(str(tmp_path))
    assert "config.json" in assert_one_line(err)


def test_other_file_is_a_load_error(tmp_path: Path) -> None:
    path = tmp_path / "weights.bin"
    path.write_bytes(b"x")
    with pytest.raises(ModelLoadError) as err:
        resolve_spec(str(path))
    assert ".gguf" in assert_one_line(err)


def test_converted_cache_entry_resolves_by_its_listed_name() -> None:
    folder = converted_dir() / "mine-0123456789ab"
    folder.mkdir(parents=True)
    (folder / CONVERTED_MARKER).write_text("{}")
    resolved = resolve_spec("mine-0123456789ab")
    assert (resolved.kind, resolved.location) == ("cached", str(folder))
