"""Choices made in the app reach config.toml without disturbing what the user wrote there."""

from __future__ import annotations

import pytest

from specchat.config import config_path, load_settings
from specchat.testing.scripted_engines import PausingEngine

from .conftest import SIZE, make_app

pytestmark = pytest.mark.anyio

HAND_WRITTEN = """\
# my specchat settings
max_new_tokens = 64   # short replies

theme = "specchat-dark"   # the default, for now

[keys]
# ctrl+arrows: F-keys are awkward here
gamma_up = "ctrl+up"
"""


async def test_ctrl_t_keeps_the_config_files_comments(engine: PausingEngine) -> None:
    path = config_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(HAND_WRITTEN, encoding="utf-8")
    app = make_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("ctrl+t")
        await pilot.pause()
        assert app.theme == "specchat-light"
    assert path.read_text(encoding="utf-8") == HAND_WRITTEN.replace(
        'theme = "specchat-dark"', 'theme = "specchat-light"'
    )
    assert load_settings().theme == "specchat-light"
