"""What the chat does to the conversation: send a message (or hold the message box while the
models cannot take it), regenerate, clear, copy, open, export, the system prompt, the Markdown
view.

:class:`ChatActions` is made by the app and adds its keys' commands to the app's table (the
chat's screen runs them); the app routes the message box's messages here. The conversation is
read from the host at each use: clearing the chat or opening another conversation swaps it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from textual.css.query import NoMatches

from specchat.store.conversation import Conversation, ConversationError, Turn
from specchat.ui.controllers.hosts import ShowsScreens
from specchat.ui.screens.conversations import ConversationsScreen
from specchat.ui.screens.system_prompt import SystemPromptScreen
from specchat.ui.state.autosave import AutoSave
from specchat.ui.talk.replay import ReplayScreen
from specchat.ui.widgets.prompt import PromptInput
from specchat.ui.widgets.transcript import SystemNote, UserMessage

if TYPE_CHECKING:
    from specchat.ui.screens.main import MainScreen
    from specchat.ui.state.commands import Commands
    from specchat.ui.state.lease import ModelLease
    from specchat.ui.state.live import LiveStats
    from specchat.ui.state.preferences import Preferences


class ChatHost(ShowsScreens, Protocol):
    """What the actions need from the app that owns the conversation."""

    conversation: Conversation
    markdown_view: bool
    target_name: str
    draft_name: str | None
    replay_only: Conversation | None

    @property
    def reply(self) -> object | None: ...

    @property
    def talk_task(self) -> str | None: ...

    def refresh_panels(self, force: bool = False) -> None: ...

    def start_reply(self) -> None: ...

    def copy_to_clipboard(self, text: str) -> None: ...


class ChatActions:
    def __init__(
        self,
        host: ChatHost,
        screen: MainScreen,
        live: LiveStats,
        lease: ModelLease,
        autosave: AutoSave,
        preferences: Preferences,
        replay: Callable[[Conversation], ReplayScreen],
    ) -> None:
        self.host = host
        self.screen = screen
        self.live = live
        self.lease = lease
        self.store = autosave.store
        self.autosave = autosave
        self.preferences = preferences
        self.replay = replay

    def add_commands(self, table: Commands) -> None:
        """The conversation's keys, each run by the method of the same name."""
        for name in (
            "regenerate",
            "clear",
            "copy_reply",
            "open_conversations",
            "export_markdown",
            "edit_system_prompt",
            "toggle_view",
        ):
            table.add(name, getattr(self, name))

    def send(self, message: PromptInput.Submitted) -> None:
        """The message box sent ``message``: a user turn, then the reply to it."""
        # The box refuses to send while it holds a reason (see hold_prompt); this catches a
        # message already on its way when a reply started, and gives its text back.
        reason = self.why_not_send()
        if reason is not None:
            message.prompt.give_back(message.text)
            self.host.notify(reason, severity="warning")
            return
        self.host.conversation.turns.append(Turn("user", message.text))
        self.screen.transcript.mount(UserMessage(message.text))
        self.host.start_reply()

    def why_not_send(self) -> str | None:
        if self.host.replay_only is not None:
            return "This is a replay: no model is loaded, so nothing can be sent."
        return self.lease.send_refusal()

    def hold_prompt(self) -> None:
        """The message box refuses to send while the models cannot take a reply."""
        with contextlib.suppress(NoMatches):  # the chat's screen is not composed yet
            self.screen.prompt.hold = self.why_not_send()

    def save(self) -> None:
        """Save the conversation now (a failure is told once, see :class:`AutoSave`)."""
        self.autosave.save(self.host.conversation)

    def idle(self, what: str) -> bool:
        """Whether the models are free for ``what``; if not, the user is told why."""
        if self.host.reply is not None:
            self.host.notify(
                f"A reply is streaming: press Esc to stop it before you {what}.", severity="warning"
            )
            return False
        if self.host.talk_task is not None:
            self.host.notify(
                f"The models are busy with {self.host.talk_task}: wait before you {what}.", severity="warning"
            )
            return False
        return True

    async def regenerate(self) -> None:
        if not self.idle("regenerate"):
            return
        turns = self.host.conversation.turns
        if turns and turns[-1].role == "assistant":
            turns.pop()
            replies = self.screen.transcript.replies()
            if replies:
                await replies[-1].remove()
            self.live.load(turns)
        if not turns or turns[-1].role != "user":
            self.host.notify("Nothing to regenerate yet.")
            return
        self.host.start_reply()

    async def clear(self) -> None:
        if not self.idle("clear the conversation"):
            return
        self.save()
        host = self.host
        host.conversation = Conversation.new(
            host.conversation.system_prompt, host.target_name, host.draft_name
        )
        await self.screen.show_conversation(host.conversation, markdown=host.markdown_view)
        self.live.reset()
        host.refresh_panels(force=True)

    def copy_reply(self) -> None:
        last = self.host.conversation.last_reply()
        if last is None:
            self.host.notify("No reply to copy yet.")
            return
        self.host.copy_to_clipboard(last.content)
        self.host.notify(f"Copied the last reply ({len(last.content)} characters).")

    def open_conversations(self) -> None:
        if (
            isinstance(self.host.screen, ConversationsScreen | ReplayScreen)
            or self.host.replay_only is not None
        ):
            return
        if not self.idle("open another conversation"):
            return
        self.save()
        self.host.push_screen(ConversationsScreen(self.store, self.store.saved()), self._open)

    async def _open(self, choice: tuple[str, str] | None) -> None:
        if choice is None:
            return
        what, conversation_id = choice
        try:
            conversation = self.store.load(conversation_id)
        except ConversationError as err:
            self.host.notify(str(err), severity="error")
            return
        if what == "replay":
            self.host.push_screen(self.replay(conversation))
            return
        self.host.conversation = conversation
        await self.screen.show_conversation(conversation, markdown=self.host.markdown_view)
        self.live.load(conversation.turns)
        self.host.refresh_panels(force=True)
        self.host.notify(f"Opened “{conversation.title}”.")

    def export_markdown(self) -> None:
        if not self.host.conversation.turns:
            self.host.notify("Nothing to export yet.")
            return
        try:
            path = self.store.export_markdown(self.host.conversation)
        except OSError as err:
            self.host.notify(f"cannot export: {err}", severity="error")
            return
        self.host.notify(f"Exported to {path}", title="Markdown")

    def edit_system_prompt(self) -> None:
        if isinstance(self.host.screen, SystemPromptScreen):
            return
        self.host.push_screen(
            SystemPromptScreen(self.host.conversation.system_prompt), self._set_system_prompt
        )

    def _set_system_prompt(self, result: tuple[str, bool] | None) -> None:
        if result is None:
            return
        prompt, make_default = result
        conversation = self.host.conversation
        conversation.system_prompt = prompt
        self.screen.transcript.query(SystemNote).first().set_prompt(prompt)
        if conversation.turns:
            self.save()
        if make_default:
            self.preferences.change("system_prompt", prompt)
        self.host.notify("System prompt updated: it applies from the next reply.")

    def toggle_view(self) -> None:
        """Markdown or the coloured tokens, in every reply."""
        host = self.host
        host.markdown_view = not host.markdown_view
        for reply in self.screen.transcript.replies():
            reply.set_view(host.markdown_view)
        self.live.set_display(markdown=host.markdown_view)
        host.refresh_panels()
