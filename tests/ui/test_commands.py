"""Keys bound to their owners: every key of the chat names a command that its screens find in
the one table the app builds, and no screen forwards a key to a controller."""

from __future__ import annotations

import inspect

import pytest

from specchat.testing.scripted_engines import PausingEngine
from specchat.ui.screens.main import MainScreen
from specchat.ui.settings.keys import APP_KEYS, APP_WIDE_KEYS, TALK_SCREEN_KEYS, action_name
from specchat.ui.state.commands import Commands
from specchat.ui.talk.race import RaceScreen
from specchat.ui.talk.replay import ReplayScreen
from specchat.ui.talk.selftest import SelfTestScreen

from .conftest import SIZE, make_app

pytestmark = pytest.mark.anyio


async def test_every_key_of_the_chat_names_a_command_of_its_table(engine: PausingEngine) -> None:
    app = make_app(engine)
    async with app.run_test(size=SIZE):
        screen = app.main_screen
        commands = {spec.command for spec in APP_KEYS if spec.scope != "app"}
        assert commands <= screen.commands.names(), commands - screen.commands.names()
        # The app-wide keys run the app's own actions, which exist.
        for spec in APP_WIDE_KEYS:
            assert action_name(spec) == f"app.{spec.command}"
            assert callable(getattr(app, f"action_{spec.command}"))
        # The talk screens get the same table for the control keys their jobs run with.
        talk_commands = {spec.command for spec in TALK_SCREEN_KEYS if spec.scope != "app"}
        assert talk_commands <= app.commands.names()


def test_the_screens_dispatch_and_forward_nothing() -> None:
    """One dispatch (``action_run``) beside the screen's own actions: none is a one-line call
    on a controller, and the replay's own actions are its own keys'."""
    for screen in (MainScreen, RaceScreen, SelfTestScreen, ReplayScreen):
        for name, member in inspect.getmembers(screen, inspect.isfunction):
            if name.startswith("action_") and member.__module__.startswith("specchat."):
                source = inspect.getsource(member)
                assert "controllers" not in source and "control_keys" not in source, name
    own = {name for name in vars(MainScreen) if name.startswith("action_")}
    assert own == set(), own  # the chat's keys all run commands; the dispatch is inherited


async def test_a_missing_command_is_ignored_and_a_dimmed_one_says_so() -> None:
    ran: list[str] = []
    table = Commands()
    table.add("go", lambda: ran.append("go"), when=lambda: False)
    over = Commands(table)
    over.add("mine", lambda: ran.append("mine"))
    await over.run("nothing")
    await over.run("go")
    await over.run("mine")
    assert ran == ["go", "mine"] and not over.live("go") and over.live("mine") and over.live("nothing")
