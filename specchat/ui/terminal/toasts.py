"""Toasts whose text is shown as text.

Notices quote servers, models, files and settings: a ``[/]`` in one would raise when the toast
draws, and a ``[@click=…]`` would become a button. Every toast of the app (widgets and screens
notify through it) goes through :meth:`PlainToasts.notify`, which makes the text visible first.
"""

from __future__ import annotations

from typing import TypeVar

from textual.app import App
from textual.notifications import SeverityLevel

from specchat.untrusted import visible

ReturnType = TypeVar("ReturnType")


class PlainToasts(App[ReturnType]):
    def notify(
        self,
        message: str,
        *,
        title: str = "",
        severity: SeverityLevel = "information",
        timeout: float | None = None,
        markup: bool = False,
    ) -> None:
        super().notify(
            visible(message), title=visible(title), severity=severity, timeout=timeout, markup=markup
        )
