"""Auto-saving the chat, telling the user once when saving fails and once when it works again."""

from __future__ import annotations

from typing import Protocol

from textual.notifications import SeverityLevel

from specchat.store.conversation import Conversation
from specchat.store.folder import ConversationStore


class Notify(Protocol):
    def __call__(
        self, message: str, *, title: str = "", severity: SeverityLevel = ..., timeout: float | None = ...
    ) -> None: ...


class AutoSave:
    """Saves (atomically) after every change. A conversation left with no message has no file.

    A failed save (read-only or full disk) changes nothing on screen: the user is told, and the
    next change tries again.
    """

    def __init__(self, store: ConversationStore, notify: Notify) -> None:
        self.store = store
        self.notify = notify
        self.failing = False
        self._told_at = 0
        """The number of turns when the user was last told a save failed."""

    def save(self, conversation: Conversation) -> None:
        before = conversation.id
        try:
            if conversation.turns:
                path = self.store.save(conversation)
                if conversation.id != before:
                    self.notify(
                        f"This conversation was changed by another specchat meanwhile: its version "
                        f"is kept, and this one is now saved as {path.name}.",
                        title="saved as a copy",
                        severity="warning",
                        timeout=20,
                    )
            else:
                self.store.delete(conversation.id)
        except OSError as err:
            self._failed(len(conversation.turns), err)
            return
        if self.failing:
            self.failing = False
            self.notify("The conversation is saved again.", title="saved")

    def _failed(self, turns: int, err: OSError) -> None:
        # Say it once per message, not at each of the saves a reply makes.
        if self.failing and turns - self._told_at < 2:
            return
        self.failing, self._told_at = True, turns
        reason = err.strerror or str(err)
        self.notify(
            f"The conversation was NOT saved ({reason}: {self.store.folder}). It stays on screen; "
            "free some space or fix the folder's permissions, and the next message saves it.",
            title="not saved",
            severity="error",
            timeout=20,
        )
