"""The message box: Enter sends, Ctrl+J inserts a new line (both remappable).

Keys are taken strictly in the order they arrive. A terminal hands a paste (without
bracketed paste), a ``tmux send-keys`` line or fast typing over ssh to the app as many key
events at once; the app forwards each to this box's queue. Enter is therefore handled here,
in that queue, and not as an app-level priority binding: a priority binding runs as soon as
the app reads the key, before the box has inserted the characters queued ahead of it, which
sent half a sentence (or nothing) and then cleared the rest.

An Enter followed at once (within :data:`PASTE_GAP`) by another key is a line break inside a
pasted block, not a send: pasted lines stay lines of one message, and nothing is sent until
an Enter that nothing follows in the same burst.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from textual import events, on
from textual.binding import Binding, BindingType
from textual.message import Message
from textual.strip import Strip
from textual.widgets import TextArea

from specchat.ui.settings.keys import PROMPT_KEYS, bindings, key_list

PASTE_GAP = 0.03
"""Seconds: an Enter followed by another key sooner than this was part of a paste. A terminal
delivers a paste within microseconds; a person's next key after Enter comes far later."""


class PromptInput(TextArea, inherit_bindings=False):
    # TextArea's own keys, less F6/F7 (select line / select all): those are the app's
    # temperature keys. Ours are listed for the footer and the help; _on_key handles them.
    BINDINGS: ClassVar[list[BindingType]] = [
        *(b for b in TextArea.BINDINGS if not (isinstance(b, Binding) and b.key in ("f6", "f7"))),
        *bindings(PROMPT_KEYS),
    ]

    class Submitted(Message):
        def __init__(self, prompt: PromptInput, text: str) -> None:
            super().__init__()
            self.prompt = prompt
            self.text = text

    class EnterSettled(Message, bubble=False):
        """Posted behind the keys that arrived with an Enter: no key followed it closely."""

        def __init__(self, enter_time: float) -> None:
            super().__init__()
            self.enter_time = enter_time

    def __init__(self, keymap: Mapping[str, str] | None = None, **kwargs: Any) -> None:
        super().__init__(
            soft_wrap=True,
            show_line_numbers=False,
            tab_behavior="focus",
            placeholder="Message · Enter sends · Ctrl+J new line · F1 help",
            **kwargs,
        )
        keymap = keymap or {}
        spec = {s.id: s for s in PROMPT_KEYS}
        self.send_keys = frozenset(key_list(keymap.get("send", spec["send"].key)))
        self.newline_keys = frozenset(key_list(keymap.get("newline", spec["newline"].key)))
        self.hold: str | None = None
        """Why a message cannot be sent now (models loading, a reply streaming), or None."""
        self._pending_enter: float | None = None

    def render_line(self, y: int) -> Strip:
        # While a resize is laid out the box can be drawn once at zero width; TextArea would
        # then wrap its placeholder at width 0 and raise.
        if self.content_size.width <= 0:
            return Strip.blank(self.size.width)
        return super().render_line(y)

    def on_mount(self) -> None:
        # A blinking cursor would make screenshots and snapshots differ from run to run.
        if self.app.is_headless:
            self.cursor_blink = False

    async def _on_key(self, event: events.Key) -> None:
        # Runs before TextArea's own handler (earlier in the MRO); preventing the default
        # keeps TextArea from inserting a new line for the keys handled here.
        if self._pending_enter is not None:
            # Only text (and more lines) continues a paste; Esc or an arrow right after Enter
            # is a person's next key, and the Enter before it was a send.
            text_like = event.is_printable or event.key in self.send_keys | self.newline_keys
            self._settle_enter(as_line_break=text_like and event.time - self._pending_enter <= PASTE_GAP)
        if event.key in self.send_keys:
            event.stop()
            event.prevent_default()
            self._pending_enter = event.time
            self.set_timer(PASTE_GAP, lambda: self._settle_after_queued_keys(event.time))
        elif event.key in self.newline_keys:
            event.stop()
            event.prevent_default()
            self._insert_line_break()

    async def _on_paste(self, event: events.Paste) -> None:
        if self._pending_enter is not None:
            self._settle_enter(as_line_break=event.time - self._pending_enter <= PASTE_GAP)

    def _settle_after_queued_keys(self, enter_time: float) -> None:
        # Through the app's queue: keys the app has read but not yet forwarded reach this
        # box before the verdict does.
        self.app.call_later(self.post_message, self.EnterSettled(enter_time))

    @on(EnterSettled)
    def _enter_settled(self, message: EnterSettled) -> None:
        if self._pending_enter == message.enter_time:
            self._settle_enter(as_line_break=False)

    def _settle_enter(self, *, as_line_break: bool) -> None:
        self._pending_enter = None
        if as_line_break:
            self._insert_line_break()
        else:
            self.action_submit()

    def _insert_line_break(self) -> None:
        if not self.read_only:
            start, end = self.selection
            self._replace_via_keyboard("\n", start, end)

    def action_submit(self) -> None:
        """Send what the box holds: the box empties at once, so later keys start a new message."""
        text = self.text.strip()
        if not text:
            return
        if self.hold is not None:
            self.notify(self.hold, severity="warning")
            return
        self.clear()
        self.post_message(self.Submitted(self, text))

    def action_newline(self) -> None:
        self._insert_line_break()

    def give_back(self, text: str) -> None:
        """Put a message that could not be sent back in front of whatever was typed since."""
        current = self.text
        self.text = f"{text}\n{current}" if current.strip() else text
        self.move_cursor(self.document.end)
