"""Remember a choice made in the app (theme, default system prompt) in the config file.

Only the one key changes: the rest of the file stays as the user wrote it, comments and
layout included, so defaults and CLI flags are never frozen into it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from specchat.config import Settings, config_path, read_config_file, update_config_file
from specchat.errors import InvalidSettingError


def remember(name: str, value: Any, path: Path | None = None) -> Path:
    """Set ``name = value`` in the config file. Raises InvalidSettingError on failure."""
    path = path or config_path()
    data = {**read_config_file(path), name: value}
    try:
        Settings(**data)
    except ValueError as err:
        raise InvalidSettingError(f"cannot save {name} to {path}: {err}") from err
    return update_config_file({name: value}, path)
