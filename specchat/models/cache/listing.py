"""What `specchat models` shows: the packaged models, and GGUF files converted into the cache."""

from __future__ import annotations

import json
import re
from pathlib import Path

from specchat.models.cache.paths import CONVERTED_MARKER, converted_dir, is_converted
from specchat.models.compute.packed_cache import FORMAT_VERSION, is_packed, packed_dir
from specchat.models.names.assemble import is_installed
from specchat.models.names.catalog import PACKAGED, PackagedModel
from specchat.models.records import ModelInfo


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
        cached=is_converted(converted_dir() / f"{model.name}-{model.key}") or _has_packed_copy(model.name),
        size_bytes=model.size,
        description=model.description,
    )


def _has_packed_copy(name: str) -> bool:
    """Whether the packed cache holds a finished copy of ``name`` that this specchat reads: the
    copy the default CPU path (``auto``) loads, named ``NAME-RECIPE-KEY``
    (specchat.models.compute.packed_cache).
    A copy packed by an earlier format is replaced at the next start, so it does not count."""
    pattern = re.compile(re.escape(name) + r"-[a-z0-9]+(\+head\d+)?-[0-9a-f]{12}")
    try:
        folders = [p for p in packed_dir().iterdir() if pattern.fullmatch(p.name)]
    except OSError:  # no packed cache yet
        return False
    return any(is_packed(folder) and _read_meta(folder).get("format") == FORMAT_VERSION for folder in folders)


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
