"""`specchat generate`: one reply, headless, as text, coloured text or the event stream."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import click

from specchat.cli.exits import reports_errors, stop_on_signals
from specchat.cli.load_progress import controls_after_loading, open_for_command
from specchat.cli.options import debug_option, model_options, prompt_options, settings_from
from specchat.cli.prompt_input import read_prompt
from specchat.engine.backend import chat_messages
from specchat.opening import controls_from
from specchat.presenters.kind_labels import KIND_STYLES, LEGEND_LABELS
from specchat.untrusted import json_text, visible

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
@prompt_options
@click.option(
    "--format",
    "output_format",
    type=click.Choice(["text", "ansi", "jsonl"]),
    default="text",
    show_default=True,
    help="text: the reply; ansi: coloured by token kind, with legend and summary; jsonl: the event "
    'stream (reasoning tokens marked "reasoning": true).',
)
@click.option(
    "--reasoning",
    "show_reasoning",
    is_flag=True,
    help="text and ansi: print a thinking model's reasoning before its answer (between <think> "
    "and </think>); without it only the answer is printed.",
)
@debug_option
@reports_errors
def generate(
    prompt: str | None, prompt_file: str | None, output_format: str, show_reasoning: bool, **options: Any
) -> None:
    """Generate one reply to PROMPT headlessly ('-' reads the prompt from stdin)."""
    prompt = read_prompt(prompt, prompt_file)
    settings = settings_from(options)
    controls_from(settings).validate()  # a bad control fails before anything loads
    check_raw(settings)
    engine = open_for_command(settings).backend
    controls = controls_after_loading(settings, engine)
    messages = chat_messages(settings.system_prompt, prompt)
    cancel = threading.Event()
    with stop_on_signals(cancel) as signals:
        stream = noticed(engine.stream_chat(messages, controls, cancel), cancel, output_format != "jsonl")
        summary = PRINTERS[output_format](stream, show_reasoning)
    if settings.server and output_format != "jsonl":
        click.echo(f"specchat: {engine.capabilities.describe()}", err=True)
    if summary is not None and summary.stop == "cancelled":
        sys.exit(signals.exit_status)


def noticed(stream: Iterator[Event], cancel: threading.Event, say: bool) -> Iterator[Event]:
    """The stream, its notices said on stderr (``say``; jsonl writes them as events), ended by
    a stall (:func:`specchat.remote.reply_stream.unattended`: one line, exit status 2)."""
    from specchat.engine.events import NoticeEvent
    from specchat.remote.reply_stream import unattended

    for event in unattended(stream, cancel):
        if say and isinstance(event, NoticeEvent):
            click.echo(f"specchat: note: {visible(event.text)}", err=True)
        yield event


def check_raw(settings: Any) -> None:
    """--raw with --server: a server renders prompts with its own template (one line, status 2)."""
    from specchat.errors import InvalidSettingError

    if settings.raw and settings.server:
        raise InvalidSettingError(
            "--raw feeds text to the local engine only: a server renders the prompt with its own "
            "template (drop --raw, or --server to run the model here)."
        )


class ReasoningFrame:
    """Reasoning printed with --reasoning is always framed by ``<think>`` and ``</think>``: a
    local model writes its own tags, a server's ``reasoning_content`` comes without them."""

    def __init__(self) -> None:
        self.inside = False
        self.tagged = False

    def before(self, token: Any) -> str:
        """Text to write before ``token``: an opening tag entering reasoning, a closing one leaving it."""
        from specchat.engine.reasoning import CLOSE_TAG, OPEN_TAG

        if token.reasoning and not self.inside:
            self.inside, self.tagged = True, OPEN_TAG in token.text
            return "" if self.tagged else OPEN_TAG + "\n"
        if not token.reasoning and self.inside:
            self.inside = False
            return "" if self.tagged else "\n" + CLOSE_TAG + "\n\n"
        return ""

    def end(self) -> str:
        """The closing tag of reasoning the reply ended in (cut before its answer)."""
        from specchat.engine.reasoning import CLOSE_TAG

        if not self.inside or self.tagged:
            return ""
        self.inside = False
        return "\n" + CLOSE_TAG


def print_text(stream: Iterator[Event], show_reasoning: bool = False) -> Any:
    """The reply's text (the answer alone, unless ``show_reasoning``), its control characters
    shown (``^[``) rather than obeyed: a model or a server must not clear the screen, retitle the
    window or write the clipboard through it."""
    from specchat.engine.events import SummaryEvent, TokenEvent

    summary = None
    frame = ReasoningFrame()
    for event in stream:
        if isinstance(event, TokenEvent):
            if event.reasoning and not show_reasoning:
                continue
            sys.stdout.write(visible(frame.before(event) + event.text))
            sys.stdout.flush()
        elif isinstance(event, SummaryEvent):
            summary = event
    sys.stdout.write(frame.end() + "\n")
    return summary


def print_jsonl(stream: Iterator[Event], show_reasoning: bool = True) -> Any:
    """The event stream, one JSON object a line. The text stays exactly as generated: JSON escapes
    its C0 controls, and DEL, C1, bidi and invisible characters are escaped too (``\\u202e``), so
    a terminal obeys none of them and nothing reorders the line."""
    from specchat.engine.events import SummaryEvent

    summary = None
    for event in stream:
        sys.stdout.write(json_text(event.to_json()) + "\n")
        sys.stdout.flush()
        if isinstance(event, SummaryEvent):
            summary = event
    return summary


def print_ansi(stream: Iterator[Event], show_reasoning: bool = False) -> Any:
    """The reply coloured by token kind (reasoning, with ``show_reasoning``, also in italics).
    The text is made visible before rich styles it: rich drops a few control characters but
    passes ESC, so the only escapes written are its own."""
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
    frame = ReasoningFrame()
    for event in stream:
        if isinstance(event, TokenEvent):
            if event.reasoning and not show_reasoning:
                continue
            style = KIND_STYLES[event.kind] + (" italic" if event.reasoning else "")
            console.print(Text(visible(frame.before(event)), style="dim"), end="")
            console.print(Text(visible(event.text), style=style), end="")
        elif isinstance(event, SummaryEvent):
            summary = event
    console.print(Text(frame.end(), style="dim"))
    if summary is not None:
        # One line however narrow the terminal (it wraps it on screen): a copied or piped summary
        # stays one line, "stop: cancelled" included.
        console.print(Text(format_summary(summary), style="dim"), soft_wrap=True)
    return summary


def format_summary(summary: Any) -> str:
    alpha = "–" if summary.alpha is None else f"{summary.alpha:.2f}"
    tau = "–" if summary.tau is None else f"{summary.tau:.2f}"
    positions = " ".join("–" if p is None else f"{p:.2f}" for p in summary.per_position) or "–"
    thinking = ""
    if summary.reasoning_tokens:
        reasoning_alpha = "–" if summary.reasoning_alpha is None else f"{summary.reasoning_alpha:.2f}"
        answer_alpha = "–" if summary.answer_alpha is None else f"{summary.answer_alpha:.2f}"
        thinking = (
            f" · reasoning {summary.reasoning_tokens} tokens α {reasoning_alpha} · answer α {answer_alpha}"
        )
    notes = "".join(f" · {visible(note)}" for note in summary.notes)
    return (
        f"{summary.tokens} tokens in {summary.rounds} rounds · α {alpha} · τ {tau}{thinking} · "
        f"{summary.tokens_per_s:.2f} tok/s · per position [{positions}] · stop: {summary.stop}{notes}"
    )


PRINTERS: dict[str, Callable[[Iterator[Any], bool], Any]] = {
    "text": print_text,
    "ansi": print_ansi,
    "jsonl": print_jsonl,
}
