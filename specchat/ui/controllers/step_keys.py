"""Step mode's two keys: pause after every round or stream again, and run one more round; over
a replay they pause, play and step the replay instead.

The reply side of step mode (the gate the engine waits at, the paused reply) is
:class:`~specchat.ui.controllers.reply.Replies`; this decides what a key press means where it lands.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from specchat.ui.controllers.hosts import ShowsScreens
from specchat.ui.screens.replay import ReplayScreen
from specchat.ui.settings.keys import display_key

if TYPE_CHECKING:

    from specchat.ui.controllers.reply import Replies
    from specchat.ui.state.lease import ModelLease


class StepKeys:
    def __init__(
        self,
        app: ShowsScreens,
        replies: Replies,
        lease: ModelLease,
        keys: dict[str, str],
        changed: Callable[[bool], object],
    ) -> None:
        self.app = app
        self.replies = replies
        self.lease = lease
        self.keys = keys
        """The effective key of each binding id."""
        self.changed = changed
        """Redraw the panels (forced or not)."""

    def toggle(self) -> None:
        """Pause after every round (on), or stream again (off). A replay pauses or plays."""
        screen = self.app.screen
        caps = self.lease.capabilities
        if isinstance(screen, ReplayScreen):
            screen.toggle_playing()
        elif caps is not None and not caps.stepping:
            self.app.notify(
                "This backend streams whole replies: it cannot pause between rounds.", severity="warning"
            )
        else:
            self.app.notify(self.replies.toggle_step_mode())
            self.changed(True)

    def step(self) -> None:
        """Run one more round (step mode), or step a replay."""
        screen = self.app.screen
        if isinstance(screen, ReplayScreen):
            screen.step_round()
        elif not self.replies.step_gate.on:
            key = display_key(self.keys.get("step_mode", ""))
            self.app.notify(f"Step mode is off: {key} pauses decoding after every round.")
        elif self.replies.step():
            self.changed(False)
