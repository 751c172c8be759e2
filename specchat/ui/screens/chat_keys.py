"""What the chat's keys drive beyond the screen they are pressed on, as Protocols.

The chat's screen (:class:`~specchat.ui.screens.main.MainScreen`) binds its keys and runs their
actions; an action that changes more than the screen calls one of the controllers the app made
(:mod:`specchat.ui.controllers`), which the screen gets through its constructor as
:class:`ChatControllers`. The Protocols name only what the keys use, so the screens import no
controller (the controllers import the screens).

:class:`ControlKeyActions` holds the actions of the keys that change what the models run (γ, the
schedule, the drafter, the temperature): the chat binds them, and so do the race and the
self-test, whose jobs run with the same controls.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from specchat.ui.controllers.controls import TEMPERATURE_STEP

if TYPE_CHECKING:
    from specchat.ui.talk.theory_tracker import TheoryTracker


class SetsControls(Protocol):
    """The control keys' rules (:class:`~specchat.ui.controllers.controls.ControlKeys`)."""

    def step_gamma(self, step: int) -> None: ...

    def cycle_schedule(self) -> None: ...

    def cycle_drafter(self) -> None: ...

    def step_temperature(self, step: float) -> None: ...

    def best_gamma(self, tracker: TheoryTracker) -> None: ...


class ConversationCommands(Protocol):
    """What the chat does to the conversation (:class:`~specchat.ui.controllers.chat_actions.ChatActions`)."""

    async def regenerate(self) -> None: ...

    async def clear(self) -> None: ...

    def copy_reply(self) -> None: ...

    def open_conversations(self) -> None: ...

    def export_markdown(self) -> None: ...

    def edit_system_prompt(self) -> None: ...

    def toggle_view(self) -> None: ...


class ReplyCommands(Protocol):
    """The reply streaming now (:class:`~specchat.ui.controllers.reply.Replies`)."""

    @property
    def active(self) -> object | None: ...

    def stop(self) -> None: ...


class StepCommands(Protocol):
    """Step mode's keys (:class:`~specchat.ui.controllers.stepping.StepKeys`)."""

    def toggle(self) -> None: ...

    def step(self) -> None: ...


class TalkCommands(Protocol):
    """Talk mode's screens and panel (:class:`~specchat.ui.talk.screens.TalkScreens`)."""

    def race(self) -> None: ...

    def selftest(self) -> None: ...

    def toggle_theory(self) -> None: ...


class RejectedDrafts(Protocol):
    """The palette's rejected drafts (:class:`~specchat.ui.controllers.theming.AppThemes`)."""

    def toggle_rejected(self) -> None: ...


class ChatControllers(Protocol):
    """The controllers behind the chat's keys (the app makes them and passes itself)."""

    @property
    def chat(self) -> ConversationCommands: ...

    @property
    def replies(self) -> ReplyCommands: ...

    @property
    def step_keys(self) -> StepCommands: ...

    @property
    def talk_screens(self) -> TalkCommands: ...

    @property
    def themes(self) -> RejectedDrafts: ...

    @property
    def control_keys(self) -> SetsControls: ...

    @property
    def theory_tracker(self) -> TheoryTracker: ...


class ControlKeyActions:
    """The actions of the control keys, for a screen that has the controls' rules (or None: a
    screen made without models, as the snapshot tests make one, shows the keys and ignores them)."""

    @property
    def control_rules(self) -> SetsControls | None:
        raise NotImplementedError

    def action_gamma_up(self) -> None:
        if (rules := self.control_rules) is not None:
            rules.step_gamma(+1)

    def action_gamma_down(self) -> None:
        if (rules := self.control_rules) is not None:
            rules.step_gamma(-1)

    def action_cycle_schedule(self) -> None:
        if (rules := self.control_rules) is not None:
            rules.cycle_schedule()

    def action_cycle_drafter(self) -> None:
        if (rules := self.control_rules) is not None:
            rules.cycle_drafter()

    def action_temperature_up(self) -> None:
        if (rules := self.control_rules) is not None:
            rules.step_temperature(+TEMPERATURE_STEP)

    def action_temperature_down(self) -> None:
        if (rules := self.control_rules) is not None:
            rules.step_temperature(-TEMPERATURE_STEP)
