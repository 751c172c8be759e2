"""Settings the user changes from the chat (the theme, the default system prompt): in force at
once and kept for the next start. Failing to keep one (a read-only config folder) is a warning,
not an error: the change still holds for this session."""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

from specchat.config import Settings
from specchat.errors import SpecchatError
from specchat.ui.settings.remembered import remember

Preference = Literal["theme", "system_prompt"]


class Preferences:
    def __init__(self, settings: Settings, warn: Callable[[str], object]) -> None:
        self.settings = settings
        self.warn = warn

    def change(self, name: Preference, value: str) -> None:
        if name == "theme":
            self.settings.theme = value
        else:
            self.settings.system_prompt = value
        try:
            remember(name, value)
        except SpecchatError as err:
            self.warn(str(err))
