"""What the controllers may ask of the app, as Protocols: each controller names the few things it
uses (showing a notice, a screen, running a worker…), so none takes the whole ``App`` and a test
can hand one a small fake. :class:`~specchat.ui.app.SpecchatApp` satisfies all of them."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from textual.message import Message
    from textual.notifications import SeverityLevel
    from textual.screen import Screen
    from textual.timer import Timer
    from textual.worker import Worker


class Notifies(Protocol):
    def notify(
        self,
        message: str,
        *,
        title: str = "",
        severity: SeverityLevel = "information",
        timeout: float | None = None,
        markup: bool = True,
    ) -> None: ...


class ShowsScreens(Notifies, Protocol):
    """Pushes and pops screens, and says which one is on top."""

    @property
    def screen(self) -> Screen[Any]: ...

    @property
    def screen_stack(self) -> list[Screen[Any]]: ...

    def push_screen(self, screen: Any, callback: Any = None, wait_for_dismiss: bool = False) -> Any: ...

    def pop_screen(self) -> Any: ...


class RunsWorkers(Notifies, Protocol):
    """Runs the engine in thread workers, wakes on a timer, and takes their messages."""

    def run_worker(
        self,
        work: Any,
        name: str | None = "",
        group: str = "default",
        description: str = "",
        exit_on_error: bool = True,
        start: bool = True,
        exclusive: bool = False,
        thread: bool = False,
    ) -> Worker[Any]: ...

    def set_interval(
        self,
        interval: float,
        callback: Callable[[], Any] | None = None,
        *,
        name: str | None = None,
        repeat: int = 0,
        pause: bool = False,
    ) -> Timer: ...

    def post_message(self, message: Message) -> bool: ...
