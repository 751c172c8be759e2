"""Settings: a TOML file in the platform config folder, SPECCHAT_* environment, then CLI flags.

Imports neither torch nor textual, so every front end can read settings cheaply.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any, Literal

import platformdirs
import tomlkit
import tomlkit.exceptions
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from specchat.errors import InvalidSettingError

APP_NAME = "specchat"


class Settings(BaseModel):
    """Everything a user may set. Field names double as TOML keys and SPECCHAT_<NAME> variables."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    target: str = "qwen-coder-1.5b"
    draft: str | None = "qwen-coder-0.5b"
    # hybrid + adaptive: the fastest pair of choices that keeps the draft model in play on the
    # bench (README, Performance); fixed γ=4 was slower than plain decoding on this CPU.
    drafter: Literal["model", "hybrid", "ngram", "none"] = "hybrid"
    gamma: int = Field(4, ge=1, le=16)
    """γ of the fixed schedule, and the first γ the others try."""
    schedule: Literal["fixed", "heuristic", "adaptive"] = "adaptive"
    temperature: float = Field(0.0, ge=0.0)
    top_k: int | None = Field(None, ge=1)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    max_new_tokens: int = Field(512, ge=1)
    seed: int | None = None
    system_prompt: str = "You are a helpful assistant."
    device: str = "auto"
    dtype: str = "auto"
    quant: Literal["4bit", "8bit"] | None = None
    cpu_path: str = "auto"
    """CPU kernels (specchat.models.cpu_quant): auto, none (stock fp32) or TARGET/DRAFT[+headN]."""
    theme: str = "specchat-dark"
    keys: dict[str, str] = Field(default_factory=dict)
    """Binding id → key(s), e.g. {"gamma_up": "ctrl+up"}; see `specchat --help` keys."""


def config_path() -> Path:
    override = os.environ.get("SPECCHAT_CONFIG")
    if override:
        return Path(override)
    return Path(platformdirs.user_config_dir(APP_NAME)) / "config.toml"


def data_dir() -> Path:
    """Where conversations are saved."""
    override = os.environ.get("SPECCHAT_DATA_DIR")
    return Path(override) if override else Path(platformdirs.user_data_dir(APP_NAME))


def _from_env() -> dict[str, Any]:
    values: dict[str, Any] = {}
    for name in Settings.model_fields:
        raw = os.environ.get(f"SPECCHAT_{name.upper()}")
        if raw is not None and name != "keys":
            values[name] = None if raw.lower() in ("", "none") else raw
    return values


def read_config_file(path: Path) -> dict[str, Any]:
    """The config file's values ({} when there is none); one clear line when it is unreadable."""
    if not path.exists():
        return {}
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as err:
        raise InvalidSettingError(f"cannot read config file {path}: {err}") from err


def load_settings(overrides: dict[str, Any] | None = None, path: Path | None = None) -> Settings:
    """File, then environment, then ``overrides`` (CLI flags; None values are ignored)."""
    path = path or config_path()
    merged = {**read_config_file(path), **_from_env()}
    merged.update({k: v for k, v in (overrides or {}).items() if v is not None})
    try:
        return Settings(**merged)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "settings"
        raise InvalidSettingError(
            f"invalid setting {where}: {first['msg']} (from {path}, env or flags)"
        ) from err


def save_settings(settings: Settings, path: Path | None = None) -> Path:
    """Write every setting into the config file, keeping its comments and layout."""
    return update_config_file(settings.model_dump(exclude_none=True), path)


def update_config_file(changes: dict[str, Any], path: Path | None = None) -> Path:
    """Set ``changes`` in the config file and leave everything else as the user wrote it.

    tomlkit edits the parsed document in place, so comments, blank lines and key order
    survive. Written atomically (temporary file, then rename): a crash never leaves half a
    file. Raises InvalidSettingError with one line when the file cannot be read or written.
    """
    path = path or config_path()
    document = _read_document(path)
    for name, value in changes.items():
        current = document.get(name)
        if isinstance(value, dict) and isinstance(current, dict):
            for key in [k for k in current if k not in value]:
                del current[key]
            for key, item in value.items():
                current[key] = item
        else:
            document[name] = value
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(tomlkit.dumps(document), encoding="utf-8")
        os.replace(tmp, path)
    except OSError as err:
        raise InvalidSettingError(f"cannot write the config file {path}: {err.strerror or err}.") from err
    return path


def _read_document(path: Path) -> tomlkit.TOMLDocument:
    if not path.exists():
        return tomlkit.document()
    try:
        return tomlkit.parse(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomlkit.exceptions.TOMLKitError) as err:
        raise InvalidSettingError(f"cannot update the config file {path}: {err}") from err
