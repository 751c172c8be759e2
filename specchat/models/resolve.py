"""Turn what the user typed (--model / --draft) into something loadable, without loading anything.

Order: packaged short name, existing folder, existing .gguf file, a converted-cache entry (the names
`specchat models` lists), then a Hugging Face id. Anything else is a ModelNotFoundError that says
what would have worked.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from specchat.errors import ModelLoadError, ModelNotFoundError
from specchat.models.cache import converted_dir, is_converted
from specchat.models.catalog import PACKAGED, PackagedModel

Kind = Literal["packaged", "folder", "gguf", "cached", "hub"]

# One slash, GitHub-like names on both sides: `Qwen/Qwen2.5-0.5B-Instruct`.
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


@dataclass(frozen=True)
class Resolved:
    kind: Kind
    name: str
    """Display name."""
    location: str
    """A path, a hub id, or the packaged name."""
    packaged: PackagedModel | None = None


def resolve_spec(spec: str) -> Resolved:
    text = spec.strip()
    if not text:
        raise ModelNotFoundError(f"no model given; {_choices()}")
    if text in PACKAGED:
        return Resolved("packaged", text, text, PACKAGED[text])
    path = Path(text).expanduser()
    if path.exists():
        return _resolve_path(path)
    cached = converted_dir() / text
    if "/" not in text and is_converted(cached):
        return Resolved("cached", text, str(cached))
    if _HUB_ID.fullmatch(text) and not _looks_like_path(text):
        return Resolved("hub", text, text)
    if _looks_like_path(text):
        raise ModelNotFoundError(
            f"{text} does not exist; pass an existing folder or .gguf file, or a packaged model "
            f"({', '.join(PACKAGED)}); run `specchat models` to see what is installed"
        )
    raise ModelNotFoundError(f"unknown model {text!r}; {_choices()}")


def _resolve_path(path: Path) -> Resolved:
    path = path.resolve()
    if path.is_dir():
        return _resolve_folder(path)
    if path.suffix.lower() == ".gguf":
        return Resolved("gguf", path.stem, str(path))
    raise ModelLoadError(f"{path} is neither a .gguf file nor a model folder; pass a .gguf file or a folder")


def _resolve_folder(path: Path) -> Resolved:
    if (path / "config.json").is_file():
        return Resolved("folder", path.name, str(path))
    # A folder holding one GGUF is what people download; accept it rather than make them name the file.
    ggufs = sorted(path.glob("*.gguf"))
    if len(ggufs) == 1:
        return Resolved("gguf", ggufs[0].stem, str(ggufs[0]))
    found = f"{len(ggufs)} .gguf files" if ggufs else "no config.json"
    raise ModelLoadError(
        f"{path} is not a model folder ({found}); pass a Hugging Face folder with config.json or a .gguf file"
    )


def _looks_like_path(text: str) -> bool:
    return text.startswith((".", "/", "~")) or text.lower().endswith(".gguf") or text.count("/") > 1


def _choices() -> str:
    names = ", ".join(PACKAGED)
    return (
        f"use a packaged model ({names}), a folder, a .gguf file or a Hugging Face id (org/name); "
        "run `specchat models` to see what is installed"
    )
