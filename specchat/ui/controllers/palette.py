"""The command palette (Ctrl+P): every action of the screen it opens over, with its key, and
every theme."""

from __future__ import annotations

from collections.abc import Awaitable, Iterator, Mapping
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol

from textual.app import SystemCommand

from specchat.ui.settings.keys import (
    APP_KEYS,
    APP_WIDE_KEYS,
    PROMPT_KEYS,
    KeyTable,
    action_name,
    display_key,
    effective_key,
)

if TYPE_CHECKING:
    from textual.dom import DOMNode


class PaletteHost(Protocol):
    """What the palette needs of the app (the app imports this module, so it names no app)."""

    @property
    def keymap(self) -> Mapping[str, str]: ...

    @property
    def specchat_themes(self) -> list[str]: ...

    def send_prompt(self) -> None: ...

    def run_action(self, action: str, default_namespace: DOMNode | None = None) -> Awaitable[Any]: ...

    def theme_description(self, name: str) -> str: ...

    def switch_theme(self, name: str) -> None: ...


def system_commands(app: PaletteHost, screen: DOMNode) -> Iterator[SystemCommand]:
    """The commands over ``screen``: the keys it binds (the app-wide ones on any other screen),
    each run as its key runs it there."""
    keymap = app.keymap
    table = screen.KEY_TABLE if isinstance(screen, KeyTable) else APP_WIDE_KEYS
    if table is APP_KEYS:  # the chat's screen, which has the message box
        send = next(spec for spec in PROMPT_KEYS if spec.id == "send")
        yield SystemCommand(
            send.description, _help(send.id, display_key(effective_key(send, keymap))), app.send_prompt
        )
    for spec in table:
        yield SystemCommand(
            spec.description,
            _help(spec.id, display_key(effective_key(spec, keymap))),
            partial(app.run_action, action_name(spec), screen),
        )
    for name in app.specchat_themes:
        yield SystemCommand(f"Theme: {name}", app.theme_description(name), partial(app.switch_theme, name))


def _help(binding_id: str, key: str) -> str:
    return f"{key} · key id {binding_id}"
