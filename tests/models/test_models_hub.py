"""Hugging Face ids: the local hub cache first; no test ever reaches the network."""

from __future__ import annotations

from pathlib import Path

import huggingface_hub
import pytest
from huggingface_hub.errors import LocalEntryNotFoundError

from specchat.errors import ModelNotFoundError
from specchat.models import load_model
from specchat.models.names.hub import hub_folder


def fake_hub(monkeypatch: pytest.MonkeyPatch, *, cached: Path | None, online: Exception | Path) -> list[bool]:
    """Replace snapshot_download: a cache that holds `cached` (or nothing), and a hub answering `online`."""
    calls: list[bool] = []

    def snapshot_download(repo_id: str, *, local_files_only: bool = False, **kwargs: object) -> str:
        calls.append(local_files_only)
        if local_files_only:
            if cached is None:
                raise LocalEntryNotFoundError("not cached")
            return str(cached)
        if isinstance(online, Exception):
            raise online
        return str(online)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    return calls


def test_cached_snapshot_is_used_without_asking_the_hub(
    monkeypatch: pytest.MonkeyPatch, tiny_folders: tuple[Path, Path]
) -> None:
    monkeypatch.delenv("HF_HUB_OFFLINE")
    calls = fake_hub(monkeypatch, cached=tiny_folders[0], online=RuntimeError("network used"))
    loaded = load_model("someone/tiny-target", device="cpu")
    assert calls == [True]
    assert (loaded.name, loaded.source) == ("someone/tiny-target", "someone/tiny-target")


def test_offline_and_not_cached(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = fake_hub(monkeypatch, cached=None, online=RuntimeError("network used"))
    with pytest.raises(ModelNotFoundError, match="HF_HUB_OFFLINE is set"):
        hub_folder("someone/model")
    assert calls == [True]


def test_unreachable_hub_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HF_HUB_OFFLINE")
    fake_hub(monkeypatch, cached=None, online=ConnectionError("Name or service not known\nmore detail"))
    with pytest.raises(ModelNotFoundError) as err:
        hub_folder("someone/model")
    message = str(err.value)
    assert "hub is unreachable: Name or service not known" in message and "\n" not in message


def test_real_cache_lookup_of_an_unknown_repo_stays_offline() -> None:
    with pytest.raises(ModelNotFoundError, match="not in the Hugging Face cache"):
        hub_folder("specchat-tests/no-such-model-xyz")
