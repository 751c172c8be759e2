"""`specchat replay`: a saved conversation played back in the TUI at its recorded pace."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from specchat.cli.exits import reports_errors
from specchat.cli.options import debug_option, settings_from


@click.command()
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--speed",
    type=click.Choice(["0.25", "0.5", "1", "2", "4"]),
    default="1",
    show_default=True,
    help="Pace relative to the recording (+/− change it while replaying).",
)
@click.option("--theme", help="Theme name (see themes/).")
@debug_option
@reports_errors
def replay(file: Path, speed: str, theme: str | None) -> None:
    """Replay a saved conversation FILE round by round at its recorded pace (no model is loaded)."""
    settings = settings_from({"theme": theme})
    from specchat.ui.app import run_replay
    from specchat.ui.settings.themes import check_theme_name

    if theme is not None:
        check_theme_name(theme)
    sys.exit(run_replay(settings, file, float(speed)))
