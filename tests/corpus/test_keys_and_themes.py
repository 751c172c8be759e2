"""Bad [keys] remaps and theme files: a warning when the app opens, the default kept, no crash.

The app always opens: a key that cannot be honoured keeps its default (so no action is ever
left without a key), and a theme file that cannot be used is skipped (the default theme
stands in when it was the configured one).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from specchat.testing.scripted_engines import PausingEngine
from specchat.ui.widgets.prompt import PromptInput

from .conftest import TERMINAL, AlreadySaved, make_app, record_notifications

pytestmark = pytest.mark.anyio


@dataclass(frozen=True)
class KeyCase:
    keys: dict[str, str]
    words: tuple[str, ...]
    """Words the warning must hold."""
    env: dict[str, str] = field(default_factory=dict)


KEY_CASES: dict[str, KeyCase] = {
    "onto another action's key": KeyCase(
        {"gamma_up": "f2"}, ("gamma_up", "gamma_down already uses", "keeping F3")
    ),
    "two actions onto one new key": KeyCase(
        {"gamma_up": "ctrl+up", "gamma_down": "ctrl+up"}, ("gamma_up", "keeping F3")
    ),
    "a key that does not exist": KeyCase({"gamma_up": "ctrl+upp"}, ("'ctrl+upp' is not a key", "keeping F3")),
    "a modifier that does not exist": KeyCase(
        {"gamma_up": "cmd+up"}, ("'cmd+up' is not a key", "keeping F3")
    ),
    "an action that does not exist": KeyCase({"gamma_upp": "ctrl+up"}, ("gamma_upp", "no such action")),
    "Textual's quit key": KeyCase({"gamma_up": "ctrl+q"}, ("Ctrl+Q is Textual's key for quit", "keeping F3")),
    "a printable character": KeyCase({"gamma_up": "g"}, ("types a character", "keeping F3")),
    "send onto export's key": KeyCase({"send": "ctrl+s"}, ("send", "export already uses", "keeping Enter")),
    "an empty key": KeyCase({"gamma_up": " "}, ("gamma_up", "keeping F3")),
    "a collision from SPECCHAT_KEYS": KeyCase(
        {}, ("gamma_up", "gamma_down already uses"), env={"SPECCHAT_KEYS": '{gamma_up = "f2"}'}
    ),
}


@pytest.mark.parametrize("name", list(KEY_CASES))
async def test_a_bad_remap_warns_and_keeps_the_default(
    name: str, engine: PausingEngine, already_saved: AlreadySaved, monkeypatch: pytest.MonkeyPatch
) -> None:
    case = KEY_CASES[name]
    for variable, value in case.env.items():
        monkeypatch.setenv(variable, value)
    app = make_app(engine, gamma=4, **({"keys": case.keys} if case.keys else {}))
    shown = record_notifications(app)
    async with app.run_test(size=TERMINAL) as pilot:
        await pilot.pause()
        warnings = [n for n in shown if "[keys]" in n]
        assert any(all(word in w for word in case.words) for w in warnings), (case.words, shown)
        await pilot.press("f3")  # γ+ keeps its key unless the remap was valid (none here is)
        assert app.controls is not None and app.controls.gamma == 5
        prompt = app.query_one(PromptInput)
        prompt.focus()
        await pilot.press("g", "o")
        assert prompt.text == "go", "typing still types"
        await pilot.press("enter")
        await pilot.pause(0.2)
        assert app.conversation.turns and app.conversation.turns[0].content == "go", "Enter still sends"
    already_saved.assert_untouched()


async def test_a_valid_remap_from_the_environment_is_honoured(
    engine: PausingEngine, already_saved: AlreadySaved, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SPECCHAT_KEYS", '{"gamma_up": "ctrl+up"}')
    app = make_app(engine, gamma=4)
    shown = record_notifications(app)
    async with app.run_test(size=TERMINAL) as pilot:
        await pilot.press("ctrl+up")
        assert app.controls is not None and app.controls.gamma == 5
        await pilot.press("f3")
        assert app.controls.gamma == 5, "F3 was remapped away"
    assert not [n for n in shown if "[keys]" in n]


GOOD_TOKENS = '[tokens]\naccepted = "green"\ncorrection = "red"\nbonus = "cyan"\ntarget = "white"\n'

THEME_CASES: dict[str, tuple[str | bytes, tuple[str, ...]]] = {
    "an invalid primary colour": (
        f'name = "broken"\nprimary = "notacolour"\n{GOOD_TOKENS}',
        ("primary = 'notacolour' is not a colour",),
    ),
    "an invalid background colour": (
        f'name = "broken"\nprimary = "#112233"\nbackground = "#12345"\n{GOOD_TOKENS}',
        ("background = '#12345' is not a colour",),
    ),
    "a colour that is a number": (f'name = "broken"\nprimary = 5\n{GOOD_TOKENS}', ("primary = 5",)),
    "no primary colour": (f'name = "broken"\n{GOOD_TOKENS}', ("has no primary colour",)),
    "a missing token style": (
        'name = "broken"\nprimary = "#112233"\n[tokens]\naccepted = "green"\n',
        ("lacks token styles", "correction"),
    ),
    "an invalid token style": (
        'name = "broken"\nprimary = "#112233"\n'
        '[tokens]\naccepted = "bold notacolour"\ncorrection = "red"\nbonus = "cyan"\ntarget = "white"\n',
        ("bad style for accepted",),
    ),
    "dark that is not true or false": (
        f'name = "broken"\nprimary = "#112233"\ndark = "yes"\n{GOOD_TOKENS}',
        ("dark must be true or false",),
    ),
    "not TOML": ('name = "broken"\nprimary = \n', ("cannot read theme",)),
    "not UTF-8": (b'name = "broken"\nprimary = "#112233"\ndescription = "caf\xe9"\n', ("not UTF-8",)),
    "no name": (f'primary = "#112233"\n{GOOD_TOKENS}', ("has no name",)),
}


@pytest.mark.parametrize("name", list(THEME_CASES))
async def test_a_bad_theme_file_is_skipped_with_a_warning(
    name: str, engine: PausingEngine, already_saved: AlreadySaved
) -> None:
    content, words = THEME_CASES[name]
    folder = already_saved.config.parent / "themes"
    folder.mkdir(exist_ok=True)
    theme_file = folder / "broken.toml"
    theme_file.write_bytes(content if isinstance(content, bytes) else content.encode())
    before = theme_file.read_bytes()
    app = make_app(engine, theme="broken")  # configured: used to crash at every start
    shown = record_notifications(app)
    async with app.run_test(size=TERMINAL) as pilot:
        await pilot.pause()
        assert app.theme == "specchat-dark"
        note = next((n for n in shown if "broken.toml" in n), "")
        for word in words:
            assert word in note, f"{word!r} not in {shown}"
        assert any("unknown theme 'broken'" in n for n in shown)
        assert "broken" not in app.specchat_themes, "Ctrl+T never offers it"
    assert theme_file.read_bytes() == before
    already_saved.assert_untouched()


def test_chat_refuses_a_broken_theme_named_on_the_command_line(already_saved: AlreadySaved) -> None:
    from click.testing import CliRunner

    from specchat.cli import main

    folder = already_saved.config.parent / "themes"
    folder.mkdir(exist_ok=True)
    (folder / "broken.toml").write_text(f'name = "broken"\nprimary = "notacolour"\n{GOOD_TOKENS}')
    result = CliRunner().invoke(main, ["chat", "--theme", "broken"], catch_exceptions=False)
    assert result.exit_code == 2
    assert result.stderr.strip().endswith("or a colour name.") and "notacolour" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    already_saved.assert_untouched()


SIZE = len(KEY_CASES) + len(THEME_CASES) + 1
"""Cases this file adds to the corpus (the positive remap check is not one)."""
