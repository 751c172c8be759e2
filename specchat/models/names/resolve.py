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
from specchat.models.cache.paths import converted_dir, is_converted
from specchat.models.names.catalog import PACKAGED, PackagedModel
from specchat.untrusted import visible

Kind = Literal["packaged", "folder", "gguf", "cached", "hub"]

NAME_LIMIT = 120
"""Characters of a file's name a model is shown by."""

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
    if path.is_dir():
        return _resolve_folder(path.resolve())
    if path.suffix.lower() == ".gguf":
        return _gguf(path)
    path = path.resolve()
    raise ModelLoadError(f"{path} is neither a .gguf file nor a model folder; pass a .gguf file or a folder")


def _gguf(path: Path) -> Resolved:
    """A GGUF file, refused at once unless it is a regular file: a FIFO would block the start
    (nothing writes to it), a device never ends. Checked under the name the user gave, so a
    link to /dev/zero is named as they typed it."""
    from specchat.files import require_regular_file

    try:
        require_regular_file(path)
    except OSError as err:
        raise ModelLoadError(f"cannot read {visible(str(path))}: {err}") from None
    path = path.resolve()
    return Resolved("gguf", display_name(path.stem), str(path))


def display_name(text: str) -> str:
    """A model's name taken from a file or folder name, as it is shown: its control characters
    made visible, cut to a line's worth (cache entries take a stricter form, see cache.py)."""
    return visible(text)[:NAME_LIMIT]


def _resolve_folder(path: Path) -> Resolved:
    if (path / "config.json").is_file():
        return Resolved("folder", display_name(path.name), str(path))
    # A folder holding one GGUF is what people download; accept it rather than make them name the file.
    ggufs = sorted(path.glob("*.gguf"))
    if len(ggufs) == 1:
        return _gguf(ggufs[0])
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
