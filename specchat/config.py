"""Settings: a TOML file in the platform config folder, SPECCHAT_* environment, then CLI flags.

Imports neither torch nor textual, so every front end can read settings cheaply.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any, Literal

import platformdirs
import tomli_w
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from specchat.engine.registry import DRAFTER_NAMES
from specchat.errors import InvalidSettingError

APP_NAME = "specchat"


class Settings(BaseModel):
    """Everything a user may set. Field names double as TOML keys and SPECCHAT_<NAME> variables."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    target: str = "qwen-coder-1.5b"
    draft: str | None = "qwen-coder-0.5b"
    # hybrid + adaptive: the fastest pair of choices that keeps the draft model in play on the
    # bench (README, Performance); fixed γ=4 was slower than plain decoding on this CPU.
    drafter: str = "hybrid"
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
    server: str | None = None
    """URL of an OpenAI-compatible server to attach to instead of loading models (--server).
    Conversations go to it only when this is set; the API key comes only from SPECCHAT_API_KEY."""
    server_timeout: float = Field(120.0, gt=0)
    """Seconds without a byte from the server before a reply fails."""
    server_verify_tls: bool = True
    """Check the server's TLS certificate (https); turn off only for a self-signed test server."""
    theme: str = "specchat-dark"
    keys: dict[str, str] = Field(default_factory=dict)
    """Binding id → key(s), e.g. {"gamma_up": "ctrl+up"}; see `specchat --help` keys."""

    @field_validator("drafter")
    @classmethod
    def _known_drafter(cls, value: str) -> str:
        if value not in DRAFTER_NAMES:
            raise ValueError(f"unknown drafter {value!r}: use {', '.join(DRAFTER_NAMES)}")
        return value


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


def _read_file(path: Path) -> dict[str, Any]:
    if not path.exists():
        return {}
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as err:
        raise InvalidSettingError(f"cannot read config file {path}: {err}") from err


def load_settings(overrides: dict[str, Any] | None = None, path: Path | None = None) -> Settings:
    """File, then environment, then ``overrides`` (CLI flags; None values are ignored)."""
    path = path or config_path()
    merged = {**_read_file(path), **_from_env()}
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
    """Write atomically, so a crash never leaves half a config file."""
    path = path or config_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    data = settings.model_dump(exclude_none=True)
    tmp = path.with_suffix(".toml.tmp")
    tmp.write_text(tomli_w.dumps(data), encoding="utf-8")
    os.replace(tmp, path)
    return path
