"""What the keys run: one table of commands by name.

Each key of :data:`~specchat.ui.settings.keys.APP_KEYS` names a command. The app builds the
table once from its controllers, each adding the commands of the keys it owns (``add_commands``);
a screen lays the commands it owns itself over it (the chat's inspector and reasoning, a replay's
pause and step), and every key of its table runs through its one dispatch,
:meth:`CommandDispatch.action_run`, as ``run('name')``. Help, footer and palette read the same
key table, so they name what a key runs without a second list.

A command missing from the table does nothing: a screen made without models (the snapshot
tests make race and self-test screens so) shows the keys and ignores them.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass

Command = Callable[[], object]
"""What a key runs: a controller's method, or a widget's; its result is awaited when it is one."""


@dataclass(frozen=True)
class Entry:
    run: Command
    when: Callable[[], bool] | None = None
    """Whether the key is live now (None: always); the footer shows it dimmed otherwise."""


class Commands:
    """Commands by name, over the tables ``under`` (looked up after this one's own).

    A view, not a copy: the app makes its table empty, hands it to the screens it builds, then
    fills it once the controllers exist (they need the screens)."""

    def __init__(self, *under: Commands) -> None:
        self._own: dict[str, Entry] = {}
        self._under = under

    def add(self, name: str, run: Command, *, when: Callable[[], bool] | None = None) -> None:
        self._own[name] = Entry(run, when)

    def find(self, name: str) -> Entry | None:
        if name in self._own:
            return self._own[name]
        for table in self._under:
            if (entry := table.find(name)) is not None:
                return entry
        return None

    def names(self) -> set[str]:
        return set(self._own).union(*(table.names() for table in self._under))

    def live(self, name: str) -> bool:
        entry = self.find(name)
        return entry is None or entry.when is None or entry.when()

    async def run(self, name: str) -> None:
        entry = self.find(name)
        if entry is None:
            return
        result = entry.run()
        if inspect.isawaitable(result):
            await result


class CommandDispatch:
    """The one action a screen's table keys run (``run('name')``), for a screen with ``commands``."""

    commands: Commands

    async def action_run(self, name: str) -> None:
        await self.commands.run(name)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "run" and parameters and not self.commands.live(str(parameters[0])):
            return None  # shown dimmed (Esc's "Stop" between replies)
        return True
