"""Saved conversations: pick one to reopen, replay it round by round, or export it to Markdown.

The screen returns ("open", id), ("replay", id), or None when closed.
"""

from __future__ import annotations

from datetime import datetime
from typing import ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import OptionList, Static
from textual.widgets.option_list import Option

from specchat.store.conversation import ConversationError
from specchat.store.folder import ConversationStore, SavedInfo
from specchat.store.markdown import fmt
from specchat.untrusted import visible


class ConversationsScreen(ModalScreen[tuple[str, str] | None]):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "close", "Close"),
        Binding("e", "export", "Export to Markdown"),
        Binding("r", "replay", "Replay round by round"),
    ]

    def __init__(self, store: ConversationStore, saved: list[SavedInfo]) -> None:
        super().__init__()
        self.store = store
        self.saved = saved

    def compose(self) -> ComposeResult:
        with Vertical(id="conversations-box"):
            if self.saved:
                options = [Option(_row(i), id=i.id, disabled=i.problem is not None) for i in self.saved]
                yield OptionList(*options, id="conversation-list")
            else:
                yield Static(f"No saved conversations yet in {self.store.folder}.", id="conversation-empty")
            hint = "Enter opens · r replays round by round · e exports to Markdown · Esc closes"
            yield Static(Text(hint, style="dim"), id="conversation-hint")

    def on_mount(self) -> None:
        self.query_one("#conversations-box").border_title = "saved conversations"

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(("open", str(event.option.id)))

    def action_close(self) -> None:
        self.dismiss(None)

    def action_replay(self) -> None:
        conversation_id = self._highlighted()
        if conversation_id is not None:
            self.dismiss(("replay", conversation_id))

    def _highlighted(self) -> str | None:
        options = self.query(OptionList)
        if not options:
            return None
        option_list = options.first()
        if option_list.highlighted is None:
            return None
        option = option_list.get_option_at_index(option_list.highlighted)
        return None if option.disabled else str(option.id)

    def action_export(self) -> None:
        conversation_id = self._highlighted()
        if conversation_id is None:
            return
        try:
            path = self.store.export_markdown(self.store.load(str(conversation_id)))
        except (ConversationError, OSError) as err:
            self.notify(str(err), severity="error")
            return
        self.notify(f"Exported to {path}", title="Markdown")


def _row(info: SavedInfo) -> Text:
    """A saved conversation's row: its title is a user's words or a shared file's, shown visibly."""
    title = visible(info.title)
    if info.problem is not None:
        return Text.assemble((title, "bold"), "\n", (f"cannot be opened: {visible(info.problem)}", "dim"))
    when = _when(info.updated)
    return Text.assemble(
        (title, "bold"), "\n", (f"{when} · {info.turns} messages · α {fmt(info.alpha)}", "dim")
    )


def _when(stamp: str) -> str:
    try:
        return datetime.fromisoformat(stamp).astimezone().strftime("%Y-%m-%d %H:%M")
    except ValueError:
        return stamp
