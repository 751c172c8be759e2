"""The chat's reply, from the message sent to the turn saved: start, drain, pause, close, and
keep or take back; also the partial reply kept when specchat quits or crashes mid-stream.

:class:`Replies` is owned by the app, which forwards it the reply messages. The engine runs only
in its thread worker, through :mod:`specchat.ui.workers.bridge`; events come back through the reply's
buffer and are drawn on a timer, never per token.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from textual.timer import Timer
from textual.worker import Worker, WorkerCancelled, WorkerFailed, WorkerState, get_current_worker

from specchat.engine.events import ContextEvent, NoticeEvent, RoundEvent, SummaryEvent, TokenEvent
from specchat.store.conversation import Conversation, Turn
from specchat.ui.controllers.hosts import RunsWorkers
from specchat.ui.state.live import LiveStats, StepView
from specchat.ui.widgets.transcript import AssistantMessage, Notice, UserMessage
from specchat.ui.workers import bridge
from specchat.ui.workers.messages import ReplyClosed, ReplyEvents, ReplyPaused

if TYPE_CHECKING:
    from specchat.engine.backend import Capabilities, Controls
    from specchat.ui.screens.main import MainScreen
    from specchat.ui.state.commands import Commands
    from specchat.ui.state.lease import ModelLease

QUIT_GRACE = 5.0
"""Seconds quitting waits for the streaming reply's current round, so its summary is saved."""
QUIT_NOTE = "specchat quit while this reply was still being generated"
CRASH_NOTE = "specchat stopped on an unexpected error while this reply streamed"


@dataclass
class ActiveReply:
    """The reply being streamed: what has arrived so far, and how to stop it."""

    id: int
    widget: AssistantMessage
    settings: dict[str, Any]
    buffer: bridge.EventBuffer = field(default_factory=bridge.EventBuffer)
    tokens: list[TokenEvent] = field(default_factory=list)
    rounds: list[RoundEvent] = field(default_factory=list)
    summary: SummaryEvent | None = None
    worker: Worker[str | None] | None = None
    drain_timer: Timer | None = None
    stopping: bool = False
    paused: bool = False
    """Step mode holds the reply between two rounds."""


class ReplyHost(RunsWorkers, Protocol):
    """What a reply needs from the app that owns it (read at each use: clearing the chat or
    opening another conversation swaps ``conversation``)."""

    conversation: Conversation
    markdown_view: bool

    @property
    def capabilities(self) -> Capabilities: ...

    def save_conversation(self) -> None: ...

    def set_busy(self, busy: bool) -> None: ...

    def key_of(self, binding_id: str) -> str: ...

    def refresh_panels(self, force: bool = False) -> None: ...


class Replies:
    """The one reply that may stream at a time, and what happens to it."""

    def __init__(
        self,
        host: ReplyHost,
        screen: MainScreen,
        live: LiveStats,
        step_gate: bridge.StepGate,
        lease: ModelLease,
    ) -> None:
        self.host = host
        self.screen = screen
        self.live = live
        self.step_gate = step_gate
        self.lease = lease
        self.active: ActiveReply | None = None
        self._seq = 0

    def _set_active(self, reply: ActiveReply | None) -> None:
        self.active = reply
        self.lease.streaming = reply is not None  # no talk job starts while a reply streams

    # ------------------------------------------------------------------ start

    def start(self, backend: bridge.Backend, controls: Controls) -> None:
        """Stream a reply to the conversation as it stands (its last turn is the user's)."""
        self._seq += 1
        settings = {
            "gamma": controls.gamma,
            "schedule": controls.schedule,
            "drafter": controls.drafter,
            "temperature": controls.temperature,
        }
        widget = self.screen.new_reply(markdown=self.host.markdown_view)
        reply = ActiveReply(self._seq, widget, settings)
        self._set_active(reply)
        self.live.start_reply()
        self.host.save_conversation()
        self.host.set_busy(True)
        reply.drain_timer = self.host.set_interval(bridge.WAKE_INTERVAL, lambda: self.drain(reply))
        messages = self.host.conversation.chat_messages()
        reply.worker = self.host.run_worker(
            lambda: self._stream(reply.id, backend, messages, controls, reply.buffer),
            name="reply",
            group="engine",
            thread=True,
            exclusive=True,
            exit_on_error=False,
        )
        if self.step_gate.on:
            self.live.set_step(StepView(on=True))

    def _stream(
        self,
        reply_id: int,
        backend: bridge.Backend,
        messages: list[dict[str, str]],
        controls: Controls,
        buffer: bridge.EventBuffer,
    ) -> str | None:
        # The worker's cancelled event is the engine's stop flag: Esc sets it, and Textual
        # sets it for every worker when the app quits.
        cancel = get_current_worker().cancelled_event
        post = self.host.post_message
        error = bridge.run_reply(
            backend,
            messages,
            controls,
            cancel,
            buffer,
            lambda: post(ReplyEvents(reply_id)),
            self.step_gate,
            lambda: post(ReplyPaused(reply_id)),
        )
        post(ReplyClosed(reply_id, error))
        return error

    # ------------------------------------------------------------------ streaming

    def on_events(self, message: ReplyEvents) -> None:
        if self.active is not None and message.reply_id == self.active.id:
            self.drain(self.active)

    def drain(self, reply: ActiveReply) -> None:
        """Show what the worker has sent since the last look."""
        shown: list[TokenEvent | RoundEvent] = []
        for event in reply.buffer.drain():
            if isinstance(event, TokenEvent):
                shown.append(event)
                reply.tokens.append(event)
            elif isinstance(event, RoundEvent):
                shown.append(event)
                reply.rounds.append(event)
            elif isinstance(event, SummaryEvent):
                reply.summary = event
            elif isinstance(event, ContextEvent):
                reply.settings["left_out"] = event.left_out
                self.screen.show_left_out(reply.widget, event)
            elif isinstance(event, NoticeEvent):
                self.show_notice(event)
            self.live.add(event)
        if shown:
            self.screen.show_events(reply.widget, shown)

    def show_notice(self, notice: NoticeEvent) -> None:
        """A notice about the streaming reply: a stall leaves the choice to the user (it may be a
        long prefill), with the key that stops it; the others are for information."""
        if notice.kind == "stall":
            stop = self.host.key_of("stop")
            self.host.notify(
                f"{notice.text} Still waiting: {stop} stops the reply.", severity="warning", timeout=15
            )
        else:
            self.host.notify(notice.text, severity="warning", timeout=10)

    def on_paused(self, message: ReplyPaused) -> None:
        """Step mode holds the reply after a round: show that round's table."""
        reply = self.active
        if reply is None or message.reply_id != reply.id:
            return
        self.drain(reply)
        if not self.step_gate.on:
            return  # step mode went off while this message was on its way: the reply goes on
        reply.paused = True
        last = reply.rounds[-1] if reply.rounds else None
        closing = None
        if last is not None:
            closing = next(
                (t for t in reversed(reply.tokens) if t.round == last.round and t.kind != "accepted"), None
            )
        self.live.set_step(StepView(on=True, paused=True, round=last, closing=closing))
        step_key = self.host.key_of("step")
        self.screen.prompt.border_title = f"paused after round {len(reply.rounds)} · {step_key} next round"
        self.screen.refresh_panels()

    def resume(self) -> None:
        """Step mode lets the reply go on (one more round, or streaming again)."""
        if self.active is not None:
            self.active.paused = False
            self.host.set_busy(True)

    def toggle_step_mode(self) -> str:
        """Pause after every round (on), or stream again (off). Returns what to tell the user."""
        on = not self.step_gate.on
        self.step_gate.set_on(on)
        if not on:
            self.resume()
        self.live.set_step(StepView(on=on))
        if not on:
            return "Step mode off: replies stream again."
        when = "after this round" if self.active is not None else "after every round of the next reply"
        return f"Step mode: decoding pauses {when}; {self.host.key_of('step')} runs one more round."

    def step(self) -> bool:
        """Let one more round run (step mode on); True when a paused reply goes on."""
        self.step_gate.allow_one()
        if self.active is None or not self.active.paused:
            return False
        self.resume()
        self.live.set_step(StepView(on=True))
        return True

    def add_commands(self, table: Commands) -> None:
        """Esc's command: stop the reply (shown dimmed between replies)."""
        table.add("stop", self.stop, when=lambda: self.active is not None)

    def stop(self) -> None:
        """Esc: the engine stops at the next round boundary; what came is kept."""
        self._ask_to_stop("stopping…")

    def _ask_to_stop(self, saying: str) -> ActiveReply | None:
        """Set the flag the engine polls between rounds: the worker then ends normally and posts
        the partial reply, which is kept. The reply asked, or None when none streams."""
        reply = self.active
        if reply is None or reply.worker is None:
            return None
        reply.stopping = True
        reply.worker.cancelled_event.set()
        self.screen.prompt.border_title = saying
        return reply

    # ------------------------------------------------------------------ closing

    async def on_closed(self, message: ReplyClosed) -> None:
        reply = self.active
        if reply is None or message.reply_id != reply.id:
            return
        self.drain(reply)  # the last tokens may still wait in the buffer: they count as arrived
        if message.error and not reply.tokens:
            self._close(reply)
            await self._take_back(reply, message.error)
            self.host.save_conversation()
        else:
            self.keep(reply, message.error)
            if message.error:
                self.host.notify(message.error, severity="error", timeout=10)
        self.host.refresh_panels(force=True)

    def _close(self, reply: ActiveReply) -> None:
        self.drain(reply)  # never drop the last tokens
        if reply.drain_timer is not None:
            reply.drain_timer.stop()
        if self.host.capabilities.kind != "local":
            reply.settings.update(self._server_settings(reply.settings))
        self._set_active(None)
        self.live.set_step(StepView(on=self.step_gate.on))
        self.host.set_busy(False)

    def keep(self, reply: ActiveReply, error: str | None) -> None:
        """Close the reply and add what it generated to the conversation, saved at once."""
        self._close(reply)
        self.host.conversation.turns.append(
            Turn.reply(reply.tokens, reply.rounds, reply.summary, reply.settings, error)
        )
        reply.widget.finish(reply.summary, reply.settings, error)
        self.host.save_conversation()

    def _server_settings(self, asked: dict[str, Any]) -> dict[str, Any]:
        """A server's reply footer: its drafter, and the γ it used where that is known (only
        after the reply, when a llama-server has shown whether it honours the γ asked for)."""
        caps = self.host.capabilities
        gamma = caps.gamma if caps.gamma_control == "fixed" else asked.get("gamma")
        if caps.gamma_control == "none":
            gamma = None
        schedule = "fixed by the server" if caps.gamma_control == "fixed" else "asked per reply"
        return {"drafter": f"{caps.kind}'s", "gamma": gamma, "schedule": schedule if gamma else ""}

    async def _take_back(self, reply: ActiveReply, error: str) -> None:
        """Nothing was generated: remove the reply and put the message back in the box."""
        await reply.widget.remove()
        turns = self.host.conversation.turns
        transcript = self.screen.transcript
        if turns and turns[-1].role == "user":
            text = turns.pop().content
            users = list(transcript.query_children(UserMessage).results(UserMessage))
            if users:
                await users[-1].remove()
            self.screen.prompt.give_back(text)
        await transcript.mount(Notice(f"error: {error}"))
        self.host.notify(error, severity="error", timeout=10)
        self.live.load(turns)

    # ------------------------------------------------------------------ quitting, crashing

    async def keep_before_exit(self) -> None:
        """Stop the streaming reply and keep it, waiting a little for its round's summary."""
        reply = self._ask_to_stop("saving the reply…")
        if reply is None or reply.worker is None:
            return
        # The engine stops at the next round boundary and sends its summary (stop
        # "cancelled"): a round is short, so wait for it rather than lose the figures.
        with contextlib.suppress(TimeoutError, WorkerCancelled, WorkerFailed):
            await asyncio.wait_for(reply.worker.wait(), QUIT_GRACE)
        error = None
        if reply.worker.state != WorkerState.SUCCESS:
            error = QUIT_NOTE
        elif isinstance(reply.worker.result, str):
            error = reply.worker.result
        self.keep(reply, error)

    def keep_after_crash(self) -> None:
        """A bug stopped the app: add what the reply had to the conversation, touching no widget."""
        reply = self.active
        if reply is None:
            return
        self._set_active(None)
        if reply.worker is not None:
            reply.worker.cancelled_event.set()
        tokens = reply.tokens + [e for e in reply.buffer.drain() if isinstance(e, TokenEvent)]
        self.host.conversation.turns.append(
            Turn.reply(tokens, reply.rounds, None, reply.settings, CRASH_NOTE)
        )
