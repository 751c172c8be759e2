"""Messages the worker bridge posts to the UI thread (the only way results come back)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from textual.message import Message

if TYPE_CHECKING:
    from specchat.models import LoadProgress
    from specchat.ui.workers.bridge import LoadedBackend


class LoadProgressed(Message):
    """One step of model loading."""

    def __init__(self, progress: LoadProgress) -> None:
        super().__init__()
        self.progress = progress


class EngineLoaded(Message):
    def __init__(self, loaded: LoadedBackend) -> None:
        super().__init__()
        self.loaded = loaded


class LoadFailed(Message):
    def __init__(self, error: str, exit_code: int) -> None:
        super().__init__()
        self.error = error
        self.exit_code = exit_code


class ReplyEvents(Message):
    """New events wait in the reply's buffer. At most one of these is pending per reply, and
    at most ~15 a second, so a fast engine never floods the UI: the handler drains everything
    that arrived meanwhile."""

    def __init__(self, reply_id: int) -> None:
        super().__init__()
        self.reply_id = reply_id


class ReplyClosed(Message):
    """The reply's worker is done (finished, stopped or failed); posted after every event."""

    def __init__(self, reply_id: int, error: str | None) -> None:
        super().__init__()
        self.reply_id = reply_id
        self.error = error


class ReplyPaused(Message):
    """Step mode holds the reply after a round: every event up to it is in the buffer."""

    def __init__(self, reply_id: int) -> None:
        super().__init__()
        self.reply_id = reply_id
