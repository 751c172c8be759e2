"""Settings: a TOML file in the platform config folder, SPECCHAT_* environment, then CLI flags.

Imports neither torch nor textual, so every front end can read settings cheaply.
"""

from __future__ import annotations

import contextlib
import difflib
import json
import os
import tomllib
from pathlib import Path
from typing import Any, Literal

import platformdirs
import tomlkit
import tomlkit.exceptions
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from specchat.engine.registry import DRAFTER_NAMES
from specchat.errors import InvalidSettingError
from specchat.files import CONFIG_LIMIT, read_user_text, write_atomic
from specchat.params import DRAFT_WINDOW, GAMMA_MAX

APP_NAME = "specchat"


SEED_MAX = 2**64 - 1
"""torch seeds a generator with an unsigned 64-bit integer."""
MAX_NEW_TOKENS_LIMIT = 1_000_000
"""Above any context a model specchat can run holds (the engine also stops at the context's end):
a larger budget is a typo, and would be sent as it is to a server."""
SERVER_TIMEOUT_LIMIT = 86_400.0
"""A day. The socket layer cannot wait much longer (time_t overflows near 1e9 s)."""
NUMBER_SETTINGS = (
    "gamma",
    "temperature",
    "top_k",
    "top_p",
    "max_new_tokens",
    "seed",
    "server_timeout",
    "draft_window",
)
"""Settings that are numbers: TOML's true/false is refused there (pydantic would read true as 1)."""
NONE_WORDS = ("", "none")
"""Written for an optional setting (draft, top_k, seed, quant), these mean "not set"."""


class Settings(BaseModel):
    """Everything a user may set. Field names double as TOML keys and SPECCHAT_<NAME> variables."""

    # inf and nan are never meaningful here (--temperature inf sampled uniformly).
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    target: str = "qwen-coder-1.5b"
    draft: str | None = "qwen-coder-0.5b"
    # hybrid + adaptive: the fastest pair of choices that keeps the draft model in play on the
    # bench (docs/performance.md); fixed γ=4 was slower than plain decoding on this CPU.
    drafter: str = "hybrid"
    gamma: int = Field(default=4, ge=1, le=GAMMA_MAX)
    """γ of the fixed schedule, and the first γ the others try."""
    schedule: Literal["fixed", "heuristic", "adaptive"] = "adaptive"
    temperature: float = Field(default=0.0, ge=0.0)
    top_k: int | None = Field(default=None, ge=1)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    max_new_tokens: int = Field(default=512, ge=1, le=MAX_NEW_TOKENS_LIMIT)
    draft_window: int = Field(default=DRAFT_WINDOW, ge=0, le=MAX_NEW_TOKENS_LIMIT)
    """A draft model far behind (a long prompt) reads at most the last this many tokens where
    reading them all would not pay; 0: it always reads them all."""
    seed: int | None = Field(default=None, ge=0, le=SEED_MAX)
    system_prompt: str = "You are a helpful assistant."
    thinking: bool = True
    """Let a thinking model reason before it answers (false: ask its template not to, where it
    can, as Qwen3's enable_thinking; a server is asked through chat_template_kwargs)."""
    raw: bool = False
    """Feed the text exactly as written: no chat template, no system prompt, BOS as the model's
    file says (base models; the local engine only)."""
    device: str = "auto"
    dtype: str = "auto"
    quant: Literal["4bit", "8bit"] | None = None
    cpu_path: str = "auto"
    """CPU kernels (specchat.models.compute.cpu_quant): auto, none (stock fp32) or TARGET/DRAFT[+headN]."""
    server: str | None = None
    """URL of an OpenAI-compatible server to attach to instead of loading models (--server).
    Conversations go to it only when this is set; the API key comes only from SPECCHAT_API_KEY."""
    server_timeout: float = Field(default=60.0, gt=0, le=SERVER_TIMEOUT_LIMIT)
    """Seconds a reply waits for the server's next token (its first, prefill included) before it
    stalls: the chat says so (Esc stops the reply), ``generate`` gives up (exit status 2)."""
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

    @field_validator(*NUMBER_SETTINGS, mode="before")
    @classmethod
    def _numbers_are_not_booleans(cls, value: Any) -> Any:
        if isinstance(value, bool):
            raise ValueError("it must be a number, not true or false")
        return value

    @field_validator("draft", "top_k", "seed", "quant", mode="before")
    @classmethod
    def _none_words_mean_unset(cls, value: Any) -> Any:
        if isinstance(value, str) and value.strip().lower() in NONE_WORDS:
            return None
        return value

    @model_validator(mode="after")
    def _quant_or_cpu_kernels(self) -> Settings:
        if self.quant is not None and self.cpu_path.strip().lower() not in ("auto", "none"):
            raise ValueError(
                f"--quant {self.quant} and --cpu-path {self.cpu_path} cannot be combined: "
                "quantize with one or the other"
            )
        return self


FLAGS = {"schedule": "--gamma-schedule", "system_prompt": "--system"}
"""Command-line spellings that are not simply --<name-with-dashes>."""


def flag_for(name: str) -> str:
    return FLAGS.get(name, "--" + name.replace("_", "-"))


def env_for(name: str) -> str:
    return f"SPECCHAT_{name.upper()}"


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
        raw = os.environ.get(env_for(name))
        if raw is None:
            continue
        if name == "keys":
            values[name] = parse_keys_variable(raw)
        else:
            values[name] = None if raw.strip().lower() in NONE_WORDS else raw
    return values


def parse_keys_variable(raw: str) -> dict[str, Any]:
    """SPECCHAT_KEYS as a TOML inline table ({gamma_up = "ctrl+up"}) or a JSON object."""
    text = raw.strip()
    value: Any = None
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        with contextlib.suppress(tomllib.TOMLDecodeError, RecursionError):
            value = tomllib.loads(f"keys = {text}")["keys"]
    if not isinstance(value, dict):
        raise InvalidSettingError(
            f"SPECCHAT_KEYS={raw!r} is not a table: write it as TOML "
            """({gamma_up = "ctrl+up", send = "enter"}) or JSON ({"gamma_up": "ctrl+up"})."""
        )
    return value


def read_config_file(path: Path) -> dict[str, Any]:
    """The config file's values ({} when there is none); one clear line when it is unreadable."""
    try:
        if not path.exists():
            return {}
        return tomllib.loads(read_user_text(path, CONFIG_LIMIT))
    except RecursionError as err:  # tomllib parses nested arrays by recursion
        raise InvalidSettingError(
            f"cannot read config file {path}: its arrays or tables nest too deeply."
        ) from err
    except UnicodeDecodeError as err:
        raise InvalidSettingError(
            f"cannot read config file {path}: it is not UTF-8 text (byte {err.object[err.start]:#04x} "
            f"at offset {err.start}); save it as UTF-8."
        ) from err
    except tomllib.TOMLDecodeError as err:
        raise InvalidSettingError(f"cannot read config file {path}: it is not valid TOML ({err}).") from err
    except OSError as err:
        raise InvalidSettingError(f"cannot read config file {path}: {err.strerror or err}.") from err


def load_settings(overrides: dict[str, Any] | None = None, path: Path | None = None) -> Settings:
    """File, then environment, then ``overrides`` (CLI flags; None values are ignored).

    A bad value is reported as one line that names where it came from (the file, the
    variable or the flag) and what is allowed.
    """
    path = path or config_path()
    from_file = read_config_file(path)
    from_env = _from_env()
    from_flags = {k: v for k, v in (overrides or {}).items() if v is not None}
    merged = {**from_file, **from_env, **from_flags}
    # [keys] entries merge, so SPECCHAT_KEYS can remap one action and keep the file's others.
    keymaps = [layer.get("keys") for layer in (from_file, from_env, from_flags)]
    if all(isinstance(k, dict) for k in keymaps if k is not None) and any(keymaps):
        merged["keys"] = {k: v for layer in keymaps if layer for k, v in layer.items()}
    try:
        return Settings(**merged)
    except ValidationError as err:
        raise InvalidSettingError(_explain(err.errors()[0], path, from_file, from_env, from_flags)) from err


def _explain(
    error: Any, path: Path, from_file: dict[str, Any], from_env: dict[str, Any], from_flags: dict[str, Any]
) -> str:
    """One line: which setting, from where, with what value, and what is allowed."""
    loc = [str(part) for part in error["loc"]]
    message = str(error["msg"])
    message = message.removeprefix("Value error, ")
    message = message[:1].lower() + message[1:]
    if not loc:
        return f"{message}."
    name = loc[0]
    if error["type"] == "extra_forbidden":
        known = sorted(Settings.model_fields)
        close = difflib.get_close_matches(name, known, n=1)
        hint = f"did you mean {close[0]!r}?" if close else f"known settings: {', '.join(known)}"
        return f"unknown setting {name!r} in {path}: {hint}"
    dotted = ".".join(loc)
    value = _as_written(error.get("input"))
    if len(loc) > 1:  # an entry of a table ([keys])
        source = "SPECCHAT_KEYS" if name in from_env else str(path)
        where = f"{dotted} = {value!r} in {source}"
    elif name in from_flags:
        where = f"{flag_for(name)} {value}"
    elif name in from_env:
        where = f"{env_for(name)}={os.environ.get(env_for(name), value)}"
    else:
        where = f"{dotted} = {value!r} in {path}"
    if name == "seed" and error["type"] in ("less_than_equal", "greater_than_equal"):
        message = f"a seed is a whole number from 0 to {SEED_MAX} (2^64 − 1)"
    elif error["type"] == "finite_number":
        message = "it must be a finite number"
    elif name in RANGES and error["type"] in _OUT_OF_RANGE:
        message = RANGES[name]
    return f"{where} is invalid: {message}."


RANGES = {
    "max_new_tokens": f"a token budget is a whole number from 1 to {MAX_NEW_TOKENS_LIMIT:,}",
    "draft_window": f"a draft window is a whole number of tokens from 0 (none) to {MAX_NEW_TOKENS_LIMIT:,}",
    "server_timeout": f"a timeout is a number of seconds above 0, at most {SERVER_TIMEOUT_LIMIT:,.0f}",
}
"""How the allowed range of a capped setting is said (pydantic's words name no unit)."""
_OUT_OF_RANGE = ("less_than_equal", "greater_than_equal", "greater_than", "less_than")


class _Written:
    """A value shown as the user wrote it: true/false as in TOML, not Python's True/False."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text

    def __str__(self) -> str:
        return self.text


def _as_written(value: Any) -> Any:
    return _Written("true" if value else "false") if isinstance(value, bool) else value


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
        write_atomic(path, tomlkit.dumps(document))
    except OSError as err:
        raise InvalidSettingError(f"cannot write the config file {path}: {err.strerror or err}.") from err
    return path


def _read_document(path: Path) -> tomlkit.TOMLDocument:
    if not path.exists():
        return tomlkit.document()
    try:
        return tomlkit.parse(read_user_text(path, CONFIG_LIMIT))
    except (OSError, UnicodeDecodeError, RecursionError, tomlkit.exceptions.TOMLKitError) as err:
        raise InvalidSettingError(f"cannot update the config file {path}: {err}") from err
