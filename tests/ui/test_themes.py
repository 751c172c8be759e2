"""The packaged themes: all load, the token kinds stay apart, and stay readable."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from rich.style import Style

from specchat.engine.events import TOKEN_KINDS
from specchat.ui.settings.themes import ThemeError, discover, load_theme, packaged_dir, token_styles

PACKAGED = ("specchat-dark", "specchat-light", "specchat-projector", "specchat-colorblind")

# Machado, Oliveira & Fernandes (2009), severity 1.0, applied to linear sRGB.
SIMULATIONS = {
    "protanopia": (
        (0.152286, 1.052583, -0.204868),
        (0.114503, 0.786281, 0.099216),
        (-0.003882, -0.048116, 1.051998),
    ),
    "deuteranopia": (
        (0.367322, 0.860646, -0.227968),
        (0.280085, 0.672501, 0.047413),
        (-0.011820, 0.042940, 0.968881),
    ),
    "tritanopia": (
        (1.255528, -0.076749, -0.178779),
        (-0.078411, 0.930809, 0.147602),
        (0.004733, 0.691367, 0.303900),
    ),
}
NORMAL = ((1.0, 0.0, 0.0), (0.0, 1.0, 0.0), (0.0, 0.0, 1.0))


def linear(hex_colour: str) -> tuple[float, float, float]:
    def one(c: float) -> float:
        return c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4

    r, g, b = (int(hex_colour[i : i + 2], 16) / 255 for i in (1, 3, 5))
    return one(r), one(g), one(b)


def lab(rgb: tuple[float, float, float]) -> tuple[float, float, float]:
    r, g, b = rgb
    x = (0.4124 * r + 0.3576 * g + 0.1805 * b) / 0.95047
    y = 0.2126 * r + 0.7152 * g + 0.0722 * b
    z = (0.0193 * r + 0.1192 * g + 0.9505 * b) / 1.08883

    def f(t: float) -> float:
        return t ** (1 / 3) if t > 0.008856 else 7.787 * t + 16 / 116

    return 116 * f(y) - 16, 500 * (f(x) - f(y)), 200 * (f(y) - f(z))


def seen_as(hex_colour: str, matrix: tuple[tuple[float, ...], ...]) -> tuple[float, float, float]:
    rgb = linear(hex_colour)
    simulated = [max(0.0, min(1.0, sum(row[j] * rgb[j] for j in range(3)))) for row in matrix]
    return lab((simulated[0], simulated[1], simulated[2]))


def delta_e(a: tuple[float, ...], b: tuple[float, ...]) -> float:
    return sum((x - y) ** 2 for x, y in zip(a, b, strict=True)) ** 0.5


def contrast(a: str, b: str) -> float:
    def luminance(h: str) -> float:
        r, g, bl = linear(h)
        return 0.2126 * r + 0.7152 * g + 0.0722 * bl

    high, low = sorted((luminance(a), luminance(b)), reverse=True)
    return (high + 0.05) / (low + 0.05)


def colours(name: str) -> dict[str, Style]:
    specs, _ = discover()
    return {kind: Style.parse(style) for kind, style in specs[name].tokens.items()}


def hex_of(style: Style) -> str:
    assert style.color is not None
    return style.color.get_truecolor().hex


def min_distance(name: str, matrix: tuple[tuple[float, ...], ...]) -> float:
    styles = colours(name)
    return min(
        delta_e(seen_as(hex_of(styles[a]), matrix), seen_as(hex_of(styles[b]), matrix))
        for a, b in itertools.combinations(TOKEN_KINDS, 2)
    )


def test_the_four_packaged_themes_load_without_errors() -> None:
    specs, errors = discover()
    assert errors == []
    assert set(PACKAGED) <= set(specs)
    assert packaged_dir() is not None
    assert specs["specchat-light"].theme.dark is False
    assert specs["specchat-projector"].theme.dark is False


@pytest.mark.parametrize("name", PACKAGED)
def test_token_kinds_differ_and_read_well_on_the_background(name: str) -> None:
    specs, _ = discover()
    spec = specs[name]
    assert min_distance(name, NORMAL) >= 20
    needed = 7.0 if name == "specchat-projector" else 4.5
    for kind, style in colours(name).items():
        background = style.bgcolor.get_truecolor().hex if style.bgcolor else spec.theme.background
        assert background is not None
        assert contrast(hex_of(style), background) >= needed, kind


@pytest.mark.parametrize("vision", sorted(SIMULATIONS))
def test_colourblind_theme_keeps_kinds_apart(vision: str) -> None:
    assert min_distance("specchat-colorblind", SIMULATIONS[vision]) >= 30


def test_colourblind_theme_has_cues_beyond_colour() -> None:
    styles = colours("specchat-colorblind")
    assert styles["correction"].underline and styles["bonus"].bold
    assert not styles["accepted"].underline and not styles["target"].bold


def test_a_user_theme_file_is_loaded_and_a_broken_one_reported(tmp_path: Path) -> None:
    good = tmp_path / "mine.toml"
    good.write_text(
        'name = "mine"\nprimary = "#ff0000"\n[tokens]\naccepted = "green"\ncorrection = "red"\n'
        'bonus = "bold blue"\ntarget = "white"\n'
    )
    (tmp_path / "broken.toml").write_text('name = "broken"\nprimary = "#fff"\n[tokens]\naccepted = "green"\n')
    specs, errors = discover([tmp_path])
    assert "mine" in specs and specs["mine"].theme.variables["token-accepted"] == "#008000"
    assert len(errors) == 1 and "lacks token styles for: correction, bonus, target" in errors[0]
    with pytest.raises(ThemeError):
        load_theme(tmp_path / "missing.toml")


def test_themes_without_token_styles_borrow_their_palette() -> None:
    from textual.theme import BUILTIN_THEMES

    styles = token_styles(BUILTIN_THEMES["nord"], None)
    assert set(styles) == set(TOKEN_KINDS)
    assert styles["correction"].underline and styles["bonus"].bold
