"""Where assembled GGUF files and converted models live."""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

CACHE_ENV = "SPECCHAT_CACHE_DIR"


def cache_dir() -> Path:
    """The cache root: $SPECCHAT_CACHE_DIR if set (tests point it at tmp dirs), else the platform's."""
    override = os.environ.get(CACHE_ENV)
    if override:
        return Path(override).expanduser()
    return Path(platformdirs.user_cache_dir("specchat"))


def public_mode(mode: int) -> int:
    """`mode` less the process umask: what a plainly created file or folder would get."""
    umask = os.umask(0)
    os.umask(umask)
    return mode & ~umask


def gguf_dir() -> Path:
    """Packaged models assembled from their chunks."""
    return cache_dir() / "gguf"


def converted_dir() -> Path:
    """GGUF models dequantized once and saved as safetensors, so later starts take seconds."""
    return cache_dir() / "converted"


CONVERTED_MARKER = "specchat.json"
"""Written last into a converted folder: its presence means the conversion finished."""


def is_converted(folder: Path) -> bool:
    return (folder / CONVERTED_MARKER).is_file()
