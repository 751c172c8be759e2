"""The cache root, on its own so the kernels (which keep their built library under it) and the
model cache (:mod:`specchat.models.cache.paths`) both find it without importing each other."""

from __future__ import annotations

import os
from pathlib import Path

# platformdirs: the per-platform cache folder (XDG on Linux, ~/Library/Caches on macOS).
import platformdirs

CACHE_ENV = "SPECCHAT_CACHE_DIR"


def cache_dir() -> Path:
    """The cache root: $SPECCHAT_CACHE_DIR if set (tests point it at tmp dirs), else the platform's."""
    override = os.environ.get(CACHE_ENV)
    if override:
        return Path(override).expanduser()
    return Path(platformdirs.user_cache_dir("specchat"))
