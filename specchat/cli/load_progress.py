"""Opening a command's backend with its progress on stderr: a bar on a terminal, lines off one."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from specchat import opening
from specchat.untrusted import masked, visible

if TYPE_CHECKING:
    from specchat.config import Settings
    from specchat.engine.backend import Backend, Controls
    from specchat.engine.session import ChatEngine


def controls_after_loading(settings: Settings, backend: Backend) -> Controls:
    """The controls for what loaded: when the drafter asked for needs a draft model that did not
    load (the default draft could not draft for the user's target), the registry's fallback,
    said in one line on stderr."""
    controls, note = opening.controls_for(settings, backend.available_drafters)
    if note is not None:
        click.echo(f"specchat: {note}", err=True)
    return controls


def open_for_command(settings: Settings) -> opening.OpenedBackend:
    """The backend :func:`specchat.opening.open_backend` opens for these settings, saying on stderr
    what loads, or which server it attached to and what that cannot report."""
    if settings.server:
        click.echo(f"specchat: connecting to {settings.server}…", err=True)
        opened = opening.open_backend(settings)
        click.echo(f"specchat: attached to {opened.target_name}.", err=True)
        for note in opened.notes:
            click.echo(f"specchat: note: {visible(masked(note))}", err=True)
        return opened
    with LoadProgressPrinter() as progress:
        return opening.open_backend(settings, progress)


def open_for_talk_job(
    settings: Settings, *, server_refusal: str, none_refusal: str
) -> tuple[ChatEngine, Controls]:
    """The local engine and its controls for a job that times and counts tokens itself (the race,
    the self-test). A server and ``--drafter none`` are refused before anything loads, each in
    the job's own words."""
    from specchat.errors import InvalidSettingError

    if settings.server:
        raise InvalidSettingError(server_refusal)
    controls = opening.controls_from(settings)
    controls.validate()
    if controls.drafter == "none":
        raise InvalidSettingError(none_refusal)
    engine = opening.local_engine(open_for_command(settings))
    return engine, controls_after_loading(settings, engine)


class LoadProgressPrinter:
    """Shows assembling / converting / loading progress on stderr (a bar on a terminal)."""

    def __init__(self) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeElapsedColumn

        self.console = Console(stderr=True)
        self.progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            DownloadColumn(),
            TimeElapsedColumn(),
            console=self.console,
            transient=True,
            disable=not self.console.is_terminal,
        )
        self.task: Any = None
        self.last_step = ""

    def __enter__(self) -> LoadProgressPrinter:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

    def __call__(self, event: Any) -> None:
        message = visible(event.message)  # names a file's name chose (emit shows them already)
        if event.stage == "notice":  # worth keeping (a damaged cache rebuilt): above the bar, every one
            self.console.print(f"specchat: {message}", markup=False, highlight=False, soft_wrap=True)
            return
        if not self.console.is_terminal:  # a log, not a bar: one line per stage of each model
            step = f"{event.model}:{event.stage}"
            if step != self.last_step:
                click.echo(f"specchat: {message}", err=True)
            self.last_step = step
            return
        from rich.markup import escape

        description = escape(message)  # the bar's text is rich markup
        if self.task is None:
            self.task = self.progress.add_task(description, total=event.total)
        self.progress.update(self.task, description=description, completed=event.done, total=event.total)
