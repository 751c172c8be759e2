"""Themes: TOML files holding a Textual palette plus the four provenance styles.

A theme file looks like::

    name = "specchat-dark"
    description = "Default dark theme"
    dark = true
    primary = "#7aa2f7"
    background = "#1a1b26"
    ...
    [tokens]                      # Rich styles: a colour, optionally bold/underline/on <bg>
    accepted = "#9ece6a"
    correction = "underline #f7768e"
    bonus = "bold #7dcfff"
    target = "#c0caf5"

The packaged themes live in ``themes/`` (``specchat/_themes`` in the wheel); files in
``<config dir>/themes/`` are loaded too, so users can add their own.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.style import Style
from textual.color import Color
from textual.theme import BUILTIN_THEMES, Theme

from specchat.config import config_path
from specchat.engine.display import REJECTED, ShownKind
from specchat.engine.events import TOKEN_KINDS
from specchat.errors import SpecchatError
from specchat.files import THEME_LIMIT, read_user_text

DEFAULT_THEME = "specchat-dark"

_PALETTE_FIELDS = (
    "primary",
    "secondary",
    "warning",
    "error",
    "success",
    "accent",
    "foreground",
    "background",
    "surface",
    "panel",
    "boost",
)


class ThemeError(SpecchatError):
    """A theme file that cannot be read or lacks what a theme needs."""


@dataclass(frozen=True)
class ThemeSpec:
    theme: Theme
    tokens: dict[str, str]
    """Token kind -> Rich style string."""
    description: str = ""
    path: Path | None = field(default=None, compare=False)


def packaged_dir() -> Path | None:
    """``specchat/_themes`` in an installed wheel, the repository's ``themes/`` in a checkout."""
    package = Path(__file__).resolve().parents[2]  # specchat/ (this file: specchat/ui/settings/)
    for candidate in (package / "_themes", package.parent / "themes"):
        if candidate.is_dir():
            return candidate
    return None


def user_dir() -> Path:
    return config_path().parent / "themes"


def load_theme(path: Path) -> ThemeSpec:
    try:
        data = tomllib.loads(read_user_text(path, THEME_LIMIT))
    except UnicodeDecodeError as err:
        raise ThemeError(f"cannot read theme {path}: it is not UTF-8 text; save it as UTF-8.") from err
    except RecursionError as err:  # tomllib parses nested arrays by recursion
        raise ThemeError(f"cannot read theme {path}: it nests arrays too deeply to be a theme.") from err
    except (OSError, tomllib.TOMLDecodeError) as err:
        raise ThemeError(f"cannot read theme {path}: {err}") from err
    return theme_from_dict(data, path)


def theme_from_dict(data: dict[str, Any], path: Path | None = None) -> ThemeSpec:
    where = f"theme {path}" if path else "theme"
    name = data.get("name")
    if not isinstance(name, str) or not name:
        raise ThemeError(f"{where} has no name.")
    if "primary" not in data:
        raise ThemeError(f"{where} ({name}) has no primary colour.")
    for key in _PALETTE_FIELDS:
        if key in data:
            _check_colour(data[key], f"{where} ({name}): {key}")
    if not isinstance(data.get("dark", True), bool):
        raise ThemeError(f"{where} ({name}): dark must be true or false, not {data['dark']!r}.")
    tokens = data.get("tokens") or {}
    missing = [kind for kind in TOKEN_KINDS if kind not in tokens]
    if missing:
        raise ThemeError(f"{where} ({name}) lacks token styles for: {', '.join(missing)}.")
    if not isinstance(tokens, dict):
        raise ThemeError(f"{where} ({name}): [tokens] must be a table of the four token styles.")
    for kind in TOKEN_KINDS:
        try:
            Style.parse(str(tokens[kind]))
        except Exception as err:  # rich raises StyleSyntaxError / ColorParseError
            raise ThemeError(f"{where} ({name}): bad style for {kind}: {err}") from err
    variables = {str(k): str(v) for k, v in (data.get("variables") or {}).items()}
    for kind in TOKEN_KINDS:
        variables.setdefault(f"token-{kind}", _colour_of(tokens[kind]) or "#888888")
    palette = {k: data[k] for k in _PALETTE_FIELDS if k in data}
    theme = Theme(name=name, dark=bool(data.get("dark", True)), variables=variables, **palette)
    return ThemeSpec(
        theme=theme,
        tokens={k: tokens[k] for k in TOKEN_KINDS},
        description=str(data.get("description", "")),
        path=path,
    )


def _check_colour(value: Any, what: str) -> None:
    """Textual parses palette colours only when the theme is applied, and crashes the app there."""
    try:
        Color.parse(value)
    except Exception as err:  # ColorParseError, or a value that is not even a string
        raise ThemeError(
            f"{what} = {value!r} is not a colour: use #rrggbb, rgb(…), hsl(…) or a colour name."
        ) from err


def check_theme_name(name: str) -> None:
    """For --theme: an unknown name is one line listing the themes there are."""
    specs, errors = discover()
    if name in specs or name in BUILTIN_THEMES:
        return
    broken = next((e for e in errors if f"({name})" in e), None)
    if broken is not None:
        raise ThemeError(broken)
    raise ThemeError(
        f"unknown theme {name!r}: use one of {', '.join(sorted(specs))}, or add {user_dir()}/{name}.toml."
    )


THEME_ORDER = ("specchat-dark", "specchat-light", "specchat-projector", "specchat-colorblind")
"""How the packaged themes cycle (F-key and palette); the user's follow, by name."""


def ordered_names(specs: dict[str, ThemeSpec]) -> list[str]:
    """Themes from theme files: the packaged four first, then the user's."""
    ordered = [name for name in THEME_ORDER if name in specs]
    return ordered + sorted(set(specs) - set(ordered))


def discover(extra_dirs: list[Path] | None = None) -> tuple[dict[str, ThemeSpec], list[str]]:
    """All themes, packaged first then user files (a user file may override by name).

    Returns the themes and a list of readable errors for files that failed.
    """
    dirs = [d for d in (packaged_dir(), user_dir(), *(extra_dirs or [])) if d is not None and d.is_dir()]
    specs: dict[str, ThemeSpec] = {}
    errors: list[str] = []
    for folder in dirs:
        for path in sorted(folder.glob("*.toml")):
            try:
                spec = load_theme(path)
            except ThemeError as err:
                errors.append(str(err))
                continue
            specs[spec.theme.name] = spec
    return specs, errors


def token_styles(theme: Theme, spec: ThemeSpec | None) -> dict[str, Style]:
    """The style of each token kind; themes without token styles borrow their palette."""
    if spec is not None:
        return {kind: Style.parse(spec.tokens[kind]) for kind in TOKEN_KINDS}
    fallback = {
        "accepted": theme.success or "#4EBF71",
        "correction": theme.error or "#BA3C5B",
        "bonus": theme.accent or theme.primary,
        "target": theme.foreground or ("#E0E0E0" if theme.dark else "#202020"),
    }
    styles = {kind: Style.parse(colour) for kind, colour in fallback.items()}
    styles["correction"] += Style(underline=True)
    styles["bonus"] += Style(bold=True)
    return styles


class TokenPalette:
    """How reply tokens are drawn: the theme's style per kind, and whether rejected drafts show.

    The app owns one and hands it to the widgets that draw tokens (they never reach into the
    app for styles). ``version`` grows with every change, so a widget's render cache knows
    when to redraw.
    """

    def __init__(self) -> None:
        self.styles: dict[str, Style] = {}
        # Off for chatting: a rejected draft drawn in place lengthens the line it sits in (a
        # code block's indentation reads wrong); one key (F12) shows them for a talk.
        self.show_rejected = False
        self.version = 0

    def use(self, styles: dict[str, Style]) -> None:
        """The styles of a newly applied theme (rejected drafts derive theirs)."""
        self.styles = dict(styles)
        self.styles[REJECTED] = rejected_style(styles)
        self.version += 1

    def toggle_rejected(self) -> bool:
        self.show_rejected = not self.show_rejected
        self.version += 1
        return self.show_rejected

    def get(self, kind: ShownKind) -> Style | None:
        return self.styles.get(kind)


def rejected_style(styles: dict[str, Style]) -> Style:
    """Struck through and dimmed, in the correction's colour: the draft the correction replaced."""
    correction = styles.get("correction")
    colour = correction.color if correction is not None else None
    return Style(color=colour, strike=True, dim=True)


def variable_defaults() -> dict[str, str]:
    """CSS variables specchat's stylesheet uses, for themes that do not set them."""
    return {
        "token-accepted": "#4EBF71",
        "token-correction": "#BA3C5B",
        "token-bonus": "#0178D4",
        "token-target": "#E0E0E0",
    }


def _colour_of(style: str) -> str | None:
    colour = Style.parse(style).color
    return colour.get_truecolor().hex if colour is not None else None
