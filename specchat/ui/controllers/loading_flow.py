"""The models' arrival: the loading screen opened with the load worker, showing its progress,
closed (with anything opened over it) when the models are in, or left showing why they are not;
then the models handed to the chat (the lease, the controls, the subtitle, the notices).

The worker itself is :func:`specchat.ui.workers.model_loading.load_models`; it reports back only through
messages, which the app hands to :class:`LoadingFlow`.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Protocol

from specchat.engine.backend import rendering
from specchat.opening import controls_for
from specchat.ui.controllers.hosts import RunsWorkers, ShowsScreens
from specchat.ui.screens.loading import LoadingScreen
from specchat.ui.workers.model_loading import load_models

if TYPE_CHECKING:
    from specchat.config import Settings
    from specchat.engine.backend import Capabilities, Controls
    from specchat.store.conversation import Conversation
    from specchat.ui.state.lease import ModelLease
    from specchat.ui.state.live import LiveStats
    from specchat.ui.widgets.prompt import PromptInput
    from specchat.ui.workers.bridge import LoadedBackend
    from specchat.ui.workers.messages import LoadFailed, LoadProgressed


class LoadHost(ShowsScreens, RunsWorkers, Protocol):
    """What the arrival of the models changes in the app that owns the chat."""

    sub_title: str

    conversation: Conversation
    target_name: str
    draft_name: str | None

    @property
    def capabilities(self) -> Capabilities: ...

    @property
    def prompt(self) -> PromptInput: ...

    def refresh_panels(self, force: bool = False) -> None: ...

    def show_rendering(self, rendering: str | None) -> None: ...


class LoadingFlow:
    def __init__(self, host: LoadHost, settings: Settings, lease: ModelLease, live: LiveStats) -> None:
        self.host = host
        self.settings = settings
        self.lease = lease
        self.live = live
        self.screen: LoadingScreen | None = None

    def start(self) -> None:
        """Open the loading screen and load the models in a thread worker."""
        settings = self.settings
        self.host.sub_title = "connecting…" if settings.server else "loading…"
        self.screen = LoadingScreen(settings.target, settings.draft, settings.server)
        self.host.push_screen(self.screen)
        self.host.run_worker(
            partial(load_models, settings, self.host.post_message),
            name="load models",
            group="engine",
            thread=True,
            exclusive=True,
            exit_on_error=False,
        )

    def progressed(self, message: LoadProgressed) -> None:
        if self.screen is not None:
            self.screen.show_progress(message.progress)
        if message.progress.stage == "notice":  # worth reading after the loading screen has closed
            self.host.notify(message.progress.message, timeout=12, markup=False)  # a file's name is no markup

    def loaded(self, loaded: LoadedBackend) -> None:
        """Close the loading screen and anything opened over it meanwhile (help, say), chat with
        the models, and give back what was typed meanwhile."""
        screen, self.screen = self.screen, None
        typed = ""
        if screen is not None:
            typed = screen.typed
            while screen in self.host.screen_stack:
                self.host.pop_screen()
        self.use(loaded)
        if typed.strip():
            self.host.prompt.give_back(typed)
        self.host.prompt.focus()

    def use(self, loaded: LoadedBackend) -> None:
        """The chat runs on ``loaded`` from now on (loaded here, or given to the app)."""
        host = app = self.host
        host.target_name, host.draft_name = loaded.target_name, loaded.draft_name
        host.conversation.target, host.conversation.draft = loaded.target_name, loaded.draft_name
        chosen, note = controls_for(self.settings, loaded.backend.available_drafters)
        self.lease.use(loaded.backend, chosen, loaded.target_name, loaded.draft_name)
        if note:
            app.notify(note, severity="warning")
        app.sub_title = attached(loaded, host.capabilities, self.live)
        for line in loaded.notes:
            app.notify(line, severity="warning", timeout=12)
        for line in prompt_notes(host.capabilities, chosen):
            app.notify(line, severity="warning", timeout=12)
        host.show_rendering(rendering(host.capabilities, chosen))
        self.lease.changed()
        host.refresh_panels(force=True)

    def failed(self, message: LoadFailed) -> None:
        app = self.host
        app.sub_title = "could not attach to the server" if self.settings.server else "models failed to load"
        screen = self.screen
        if screen is not None:
            while app.screen is not screen and screen in app.screen_stack:
                app.pop_screen()
            screen.show_error(message.error, message.exit_code)
        else:
            app.notify(message.error, severity="error", timeout=30)


def prompt_notes(caps: Capabilities, controls: Controls) -> list[str]:
    """What the settings ask of the prompt that this backend cannot do."""
    notes = []
    if not controls.thinking and not caps.thinking_switch:
        notes.append(
            "thinking = false: this model's chat template has no switch for it (enable_thinking), "
            "so the model reasons as it does; its reasoning still shows folded."
        )
    if controls.raw and not caps.raw:
        notes.append("raw mode feeds text to the local engine only: this server renders its own template.")
    return notes


LEGEND_NOTES = {
    "inferred": "colours inferred from the server's counters",
    "none": "this server reports no provenance: tokens uncoloured",
}


def attached(loaded: LoadedBackend, caps: Capabilities, live: LiveStats) -> str:
    """The app's subtitle once the models are in: the pair and the device, or the server (whose
    tokens are then measured as they arrive, the legend saying what its colours are worth)."""
    if caps.kind != "local":
        live.by_arrival = True  # a server times no rounds
        live.set_display(note=LEGEND_NOTES.get(caps.provenance, ""))
        return f"server {loaded.target_name}"
    draft = f"draft {loaded.draft_name}" if loaded.draft_name else "no draft model"
    return " · ".join(p for p in (f"target {loaded.target_name}", draft, loaded.device) if p)
