"""`specchat chat`: the TUI (also what `specchat` alone opens)."""

from __future__ import annotations

import sys
from typing import Any

import click

from specchat.cli.exits import reports_errors
from specchat.cli.options import debug_option, model_options, prompt_options, settings_from


@click.command()
@model_options
@prompt_options
@click.option("--theme", help="Theme name (see themes/).")
@debug_option
@reports_errors
def chat(**options: Any) -> None:
    """Open the chat (the default command)."""
    settings = settings_from(options)
    from specchat.ui.app import run_chat
    from specchat.ui.settings.themes import check_theme_name

    if options.get("theme") is not None:
        check_theme_name(options["theme"])
    sys.exit(run_chat(settings))
