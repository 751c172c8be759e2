"""What `specchat models` shows: the packaged models, and GGUF files converted into the cache."""

from __future__ import annotations

import json
from pathlib import Path

from specchat.models.assemble import is_installed
from specchat.models.cache import CONVERTED_MARKER, converted_dir, is_converted
from specchat.models.records import ModelInfo
from specchat.models.registry import PACKAGED, PackagedModel


def list_models() -> list[ModelInfo]:
    """Packaged models first (in table order), then cached conversions of the user's own files."""
    packaged = [_packaged_info(model) for model in PACKAGED.values()]
    return packaged + _cached_infos()


def _packaged_info(model: PackagedModel) -> ModelInfo:
    return ModelInfo(
        name=model.name,
        kind="packaged",
        role=model.role,
        installed=is_installed(model),
        cached=is_converted(converted_dir() / f"{model.name}-{model.key}"),
        size_bytes=model.size,
        description=model.description,
    )


def _cached_infos() -> list[ModelInfo]:
    root = converted_dir()
    if not root.is_dir():
        return []
    folders = sorted(p for p in root.iterdir() if not p.name.startswith(".") and is_converted(p))
    infos = []
    for folder in folders:
        meta = _read_meta(folder)
        if str(meta.get("origin", "")).startswith("packaged:"):
            continue  # already listed as its packaged name
        infos.append(
            ModelInfo(
                name=folder.name,
                kind="cached",
                role="single",
                installed=True,
                cached=True,
                size_bytes=_folder_size(folder),
                description=f"converted from {meta.get('origin', 'a GGUF file')}",
            )
        )
    return infos


def _read_meta(folder: Path) -> dict[str, object]:
    try:
        meta = json.loads((folder / CONVERTED_MARKER).read_text())
    except (OSError, ValueError):
        return {}
    return meta if isinstance(meta, dict) else {}


def _folder_size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
