"""The command palette (Ctrl+P): every action, with its key, and every theme."""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial
from typing import TYPE_CHECKING

from textual.app import SystemCommand

from specchat.ui.keys import APP_KEYS, PROMPT_KEYS, display_key, effective_key

if TYPE_CHECKING:
    from specchat.ui.app import SpecchatApp


def system_commands(app: SpecchatApp) -> Iterator[SystemCommand]:
    keymap = app.keymap
    send = next(spec for spec in PROMPT_KEYS if spec.id == "send")
    yield SystemCommand(
        send.description, _help(send.id, display_key(effective_key(send, keymap))), app.send_prompt
    )
    for spec in APP_KEYS:
        yield SystemCommand(
            spec.description,
            _help(spec.id, display_key(effective_key(spec, keymap))),
            partial(app.run_action, spec.action),
        )
    for name in app.specchat_themes:
        yield SystemCommand(f"Theme: {name}", app.theme_description(name), partial(app.switch_theme, name))


def _help(binding_id: str, key: str) -> str:
    return f"{key} · key id {binding_id}"
