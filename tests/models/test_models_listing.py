"""`specchat models`: packaged entries and the user's converted GGUF files."""

from __future__ import annotations

import json

import pytest

from specchat.models import list_models
from specchat.models.cache.paths import CONVERTED_MARKER, converted_dir
from specchat.models.names import assemble
from specchat.models.names.catalog import PACKAGED


def test_packaged_models_are_listed_in_order(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(assemble, "locate_package", lambda package: None)
    infos = list_models()
    assert [i.name for i in infos] == list(PACKAGED)
    assert [i.role for i in infos] == ["target", "draft", "single"]
    assert all(i.kind == "packaged" and not i.installed and not i.cached for i in infos)
    assert infos[0].size_bytes == 1_117_320_768


def test_cached_conversions_are_listed_once() -> None:
    for name, origin in [
        ("mine-0123456789ab", "/models/mine.gguf"),
        ("qwen-coder-0.5b-1d9614638d18", "packaged:x"),
    ]:
        folder = converted_dir() / name
        folder.mkdir(parents=True)
        (folder / CONVERTED_MARKER).write_text(json.dumps({"origin": origin}))
    (converted_dir() / ".tmp-half-written").mkdir()
    infos = list_models()
    cached = [i for i in infos if i.kind == "cached"]
    assert [(i.name, i.description) for i in cached] == [
        ("mine-0123456789ab", "converted from /models/mine.gguf")
    ]
    assert next(i for i in infos if i.name == "qwen-coder-0.5b").cached
