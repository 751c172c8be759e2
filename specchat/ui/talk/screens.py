"""Talk mode's screens and panel, made with what each needs: the race, the self-test, the theory
panel, and a replay of a saved conversation.

:class:`TalkScreens` hands them the model lease, the palette, the keys and the system prompt
(and the command table) through their constructors; whether one may open now is
:mod:`specchat.ui.talk.rules`'s rule.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from textual.css.query import NoMatches

from specchat.ui.controllers.hosts import ShowsScreens
from specchat.ui.settings.keys import display_key
from specchat.ui.talk import rules
from specchat.ui.talk.race import RaceScreen
from specchat.ui.talk.replay import ReplayScreen
from specchat.ui.talk.selftest import SelfTestScreen
from specchat.ui.talk.theory import TheoryPanel

if TYPE_CHECKING:
    from specchat.store.conversation import Conversation
    from specchat.ui.screens.main import MainScreen
    from specchat.ui.settings.themes import TokenPalette
    from specchat.ui.state.commands import Commands
    from specchat.ui.state.lease import ModelLease
    from specchat.ui.talk.theory_tracker import TheoryTracker


class TalkScreens:
    def __init__(
        self,
        app: ShowsScreens,
        lease: ModelLease,
        palette: TokenPalette,
        tracker: TheoryTracker,
        main_screen: MainScreen,
        conversation: Callable[[], Conversation],
        keys: dict[str, str],
        commands: Commands,
        replay_speed: float = 1.0,
    ) -> None:
        self.app = app
        self.lease = lease
        self.palette = palette
        self.tracker = tracker
        self.main_screen = main_screen
        self.conversation = conversation
        self.keys = keys
        """The effective key of each binding id."""
        self.commands = commands
        """The app's command table: the race and self-test run the control keys' commands (their
        jobs run with the controls), a replay all the chat's."""
        self.replay_speed = replay_speed

    def add_commands(self, table: Commands) -> None:
        """Talk mode's keys: the theory panel, the race, the self-test."""
        table.add("theory", self.toggle_theory)
        table.add("race", self.race)
        table.add("selftest", self.selftest)

    def race(self) -> None:
        if isinstance(self.app.screen, RaceScreen) or not self._can_open("the race"):
            return
        prompt = rules.default_prompt(self.conversation())
        self.app.push_screen(
            RaceScreen(
                prompt,
                lease=self.lease,
                palette=self.palette,
                system_prompt=self._system_prompt,
                commands=self.commands,
            )
        )

    def selftest(self) -> None:
        if isinstance(self.app.screen, SelfTestScreen) or not self._can_open("the self-test"):
            return
        self.app.push_screen(
            SelfTestScreen(lease=self.lease, system_prompt=self._system_prompt, commands=self.commands)
        )

    def toggle_theory(self) -> None:
        """Open the theory panel on the chat's screen, or close it."""
        try:
            self.main_screen.query_one(TheoryPanel).remove()
            return
        except NoMatches:
            pass
        best_gamma_key = display_key(self.keys.get("best_gamma", ""))
        self.main_screen.mount(TheoryPanel(self.tracker, self.lease, best_gamma_key))

    def replay(self, conversation: Conversation) -> ReplayScreen:
        return ReplayScreen(
            conversation, self.palette, self.keys, commands=self.commands, speed=self.replay_speed
        )

    def _can_open(self, what: str) -> bool:
        reason = rules.why_not_open(self.lease, what)
        if reason is not None:
            self.app.notify(reason, severity="warning")
        return reason is None

    def _system_prompt(self) -> str | None:
        return self.conversation().system_prompt
