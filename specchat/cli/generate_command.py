"""`specchat generate`: one reply, headless, as text, coloured text or the event stream."""

from __future__ import annotations

import json
import re
import sys
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import click

from specchat.cli.exits import reports_errors, stop_on_signals
from specchat.cli.load_progress import controls_after_loading, open_for_command
from specchat.cli.options import debug_option, model_options, settings_from
from specchat.cli.prompt_input import read_prompt
from specchat.opening import controls_from
from specchat.presenters.kind_labels import KIND_STYLES, LEGEND_LABELS
from specchat.untrusted import visible

if TYPE_CHECKING:
    from specchat.engine.events import Event


@click.command()
@click.argument("prompt", required=False)
@click.option(
    "--prompt-file",
    metavar="FILE",
    help="Read the prompt from FILE (UTF-8 text; '-' is standard input) instead of PROMPT.",
)
@model_options
@click.option(
    "--format",
    "output_format",
    type=click.Choice(["text", "ansi", "jsonl"]),
    default="text",
    show_default=True,
    help="text: the reply; ansi: coloured by token kind, with legend and summary; jsonl: the event stream.",
)
@debug_option
@reports_errors
def generate(prompt: str | None, prompt_file: str | None, output_format: str, **options: Any) -> None:
    """Generate one reply to PROMPT headlessly ('-' reads the prompt from stdin)."""
    prompt = read_prompt(prompt, prompt_file)
    settings = settings_from(options)
    controls_from(settings).validate()  # a bad control fails before anything loads
    engine = open_for_command(settings).backend
    controls = controls_after_loading(settings, engine)
    messages = [{"role": "system", "content": settings.system_prompt}] if settings.system_prompt else []
    messages.append({"role": "user", "content": prompt})
    cancel = threading.Event()
    with stop_on_signals(cancel) as signals:
        stream = engine.stream_chat(messages, controls, cancel)
        summary = PRINTERS[output_format](stream)
    if settings.server and output_format != "jsonl":
        click.echo(f"specchat: {engine.capabilities.describe()}", err=True)
    if summary is not None and summary.stop == "cancelled":
        sys.exit(signals.exit_status)


def print_text(stream: Iterator[Event]) -> Any:
    """The reply's text, its control characters shown (``^[``) rather than obeyed: a model or a
    server must not clear the screen, retitle the window or write the clipboard through it."""
    from specchat.engine.events import SummaryEvent, TokenEvent

    summary = None
    for event in stream:
        if isinstance(event, TokenEvent):
            sys.stdout.write(visible(event.text))
            sys.stdout.flush()
        elif isinstance(event, SummaryEvent):
            summary = event
    sys.stdout.write("\n")
    return summary


JSON_UNESCAPED_CONTROLS = re.compile("[\x7f-\x9f]")
"""What json.dumps(ensure_ascii=False) leaves raw: DEL and the C1 controls (CSI is one)."""


def print_jsonl(stream: Iterator[Event]) -> Any:
    """The event stream, one JSON object a line. The text stays exactly as generated; JSON escapes
    its C0 controls, and DEL and C1 are escaped here (``\\u009b``), so a terminal obeys none."""
    from specchat.engine.events import SummaryEvent

    summary = None
    for event in stream:
        line = json.dumps(event.to_json(), ensure_ascii=False)
        line = JSON_UNESCAPED_CONTROLS.sub(lambda match: f"\\u{ord(match.group()):04x}", line)
        sys.stdout.write(line + "\n")
        sys.stdout.flush()
        if isinstance(event, SummaryEvent):
            summary = event
    return summary


def print_ansi(stream: Iterator[Event]) -> Any:
    """The reply coloured by token kind. The text is made visible before rich styles it: rich
    drops a few control characters but passes ESC, so the only escapes written are its own."""
    from rich.console import Console
    from rich.text import Text

    from specchat.engine.events import SummaryEvent, TokenEvent

    console = Console(highlight=False, force_terminal=None)
    legend = Text("legend: ")
    for kind, label in LEGEND_LABELS.items():
        legend.append(f" {label} ", style=KIND_STYLES[kind] + " reverse")
        legend.append(" ")
    console.print(legend)
    summary = None
    for event in stream:
        if isinstance(event, TokenEvent):
            console.print(Text(visible(event.text), style=KIND_STYLES[event.kind]), end="")
        elif isinstance(event, SummaryEvent):
            summary = event
    console.print()
    if summary is not None:
        console.print(Text(format_summary(summary), style="dim"))
    return summary


def format_summary(summary: Any) -> str:
    alpha = "–" if summary.alpha is None else f"{summary.alpha:.2f}"
    tau = "–" if summary.tau is None else f"{summary.tau:.2f}"
    positions = " ".join("–" if p is None else f"{p:.2f}" for p in summary.per_position) or "–"
    return (
        f"{summary.tokens} tokens in {summary.rounds} rounds · α {alpha} · τ {tau} · "
        f"{summary.tokens_per_s:.2f} tok/s · per position [{positions}] · stop: {summary.stop}"
    )


PRINTERS: dict[str, Callable[[Iterator[Any]], Any]] = {
    "text": print_text,
    "ansi": print_ansi,
    "jsonl": print_jsonl,
}
