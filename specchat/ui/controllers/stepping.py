"""Step mode's two keys on the chat: pause after every round or stream again, and run one more
round (a replay's screen pauses, plays and steps the replay with them itself).

The reply side of step mode (the gate the engine waits at, the paused reply) is
:class:`~specchat.ui.controllers.reply.Replies`; this decides what a key press means where it lands.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from specchat.ui.controllers.hosts import Notifies
from specchat.ui.settings.keys import display_key

if TYPE_CHECKING:
    from specchat.ui.controllers.reply import Replies
    from specchat.ui.state.commands import Commands
    from specchat.ui.state.lease import ModelLease


class StepKeys:
    def __init__(
        self,
        app: Notifies,
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

    def add_commands(self, table: Commands) -> None:
        table.add("toggle_step_mode", self.toggle)
        table.add("step", self.step)

    def toggle(self) -> None:
        """Pause after every round (on), or stream again (off)."""
        caps = self.lease.capabilities
        if caps is not None and not caps.stepping:
            self.app.notify(
                "This backend streams whole replies: it cannot pause between rounds.", severity="warning"
            )
        else:
            self.app.notify(self.replies.toggle_step_mode())
            self.changed(True)

    def step(self) -> None:
        """Run one more round (step mode)."""
        if not self.replies.step_gate.on:
            key = display_key(self.keys.get("step_mode", ""))
            self.app.notify(f"Step mode is off: {key} pauses decoding after every round.")
        elif self.replies.step():
            self.changed(False)
