"""Remember a choice made in the app (theme, default system prompt) in the config file.

Only the one key changes: the rest of the file stays as the user wrote it, so defaults and
CLI flags are never frozen into it. Written atomically, like ``save_settings``.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any

import tomli_w

from specchat.config import Settings, config_path
from specchat.errors import InvalidSettingError


def remember(name: str, value: Any, path: Path | None = None) -> Path:
    """Set ``name = value`` in the config file. Raises InvalidSettingError on failure."""
    path = path or config_path()
    try:
        data: dict[str, Any] = tomllib.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
    except (OSError, tomllib.TOMLDecodeError) as err:
        raise InvalidSettingError(f"cannot update {path}: {err}") from err
    data[name] = value
    try:
        Settings(**data)
    except ValueError as err:
        raise InvalidSettingError(f"cannot save {name} to {path}: {err}") from err
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(tomli_w.dumps(data), encoding="utf-8")
        os.replace(tmp, path)
    except OSError as err:
        raise InvalidSettingError(f"cannot write {path}: {err}") from err
    return path
