"""`specchat race`: plain against speculative decoding on one prompt, replayed side by side."""

from __future__ import annotations

import json
import os
import sys
import threading
from pathlib import Path
from typing import Any

import click

from specchat.cli.exits import reports_errors, stop_on_signals, write_output
from specchat.cli.load_progress import open_for_talk_job
from specchat.cli.options import debug_option, model_options, settings_from
from specchat.cli.prompt_input import read_prompt
from specchat.engine.backend import chat_messages
from specchat.engine.race import WARM_UP_TOKENS
from specchat.errors import InvalidSettingError
from specchat.files import RACE_LIMIT, read_user_text
from specchat.presenters.kind_labels import KIND_STYLES
from specchat.untrusted import json_text

REPLAY_FPS = 20


@click.command()
@click.argument("prompt", required=False)
@click.option("--prompt-file", metavar="FILE", help="Read the prompt from FILE ('-' is standard input).")
@model_options
@click.option(
    "--warm-up",
    type=click.IntRange(0),
    default=WARM_UP_TOKENS,
    show_default=True,
    help="Tokens decoded both ways first, untimed (a fresh process's first passes are slow).",
)
@click.option(
    "--replay/--no-replay",
    default=True,
    help="Play both lanes back side by side at their measured pace (on a terminal; default on).",
)
@click.option(
    "--json", "json_path", metavar="FILE", help="Save the race as JSON (per-token times of both lanes)."
)
@click.option("--svg", "svg_path", metavar="FILE", help="Save the finish line as an SVG screenshot.")
@click.option(
    "--load", "load_path", metavar="FILE", help="Replay a race saved with --json instead of running one."
)
@debug_option
@reports_errors
def race(
    prompt: str | None,
    prompt_file: str | None,
    warm_up: int,
    replay: bool,
    json_path: str | None,
    svg_path: str | None,
    load_path: str | None,
    **options: Any,
) -> None:
    """Race plain decoding against speculative decoding on PROMPT, then replay both side by side.

    The lanes are decoded one after the other (each from empty caches, every token timestamped),
    then played back in sync at their measured pace. The finish line gives the measured
    speed-up, α, τ and, at temperature 0, whether both texts are identical token for token.
    Decodes at most 128 tokens per lane unless --max-new-tokens is given.
    """
    from specchat.engine.race import RACE_TOKENS, RaceCancelled, RaceResult, run_race

    result: RaceResult
    if load_path is not None:
        if prompt is not None or prompt_file is not None:
            raise InvalidSettingError("--load replays a saved race: give no prompt with it.")
        result = load_race(load_path)
    else:
        prompt = read_prompt(prompt, prompt_file)
        if options.get("max_new_tokens") is None:
            options["max_new_tokens"] = RACE_TOKENS
        settings = settings_from(options)
        engine, controls = open_for_talk_job(
            settings,
            server_refusal="the race needs local models (it times every token itself): for a server, "
            "use `specchat bench --server URL --baseline-server URL`.",
            none_refusal="--drafter none drafts nothing: both lanes would be plain decoding.",
        )
        messages = chat_messages(settings.system_prompt, prompt)
        cancel = threading.Event()
        with stop_on_signals(cancel) as signals, RaceProgress() as progress:
            try:
                result = run_race(
                    engine,
                    messages,
                    controls,
                    progress=progress,
                    cancel=cancel,
                    warm_up_tokens=warm_up,
                    models={"target": settings.target, "draft": settings.draft},
                )
            except RaceCancelled as err:
                click.echo(f"specchat: {err}.", err=True)
                sys.exit(signals.exit_status)
    show_race(result, replay)
    if json_path is not None:
        write_output(json_path, json_text(result.to_json(), indent=1) + "\n")
        click.echo(f"specchat: race saved to {json_path}", err=True)
    if svg_path is not None:
        write_output(svg_path, race_svg(result))
        click.echo(f"specchat: screenshot saved to {svg_path}", err=True)


def load_race(path: str) -> Any:
    from specchat.engine.race import RaceResult

    try:
        data = json.loads(read_user_text(Path(path), RACE_LIMIT))
    except FileNotFoundError as err:
        raise InvalidSettingError(f"{path} does not exist.") from err
    except RecursionError as err:  # json parses nested arrays by recursion
        raise InvalidSettingError(f"cannot read {path}: it nests lists too deeply to be a race.") from err
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise InvalidSettingError(f"cannot read {path} as JSON: {err}.") from err
    try:
        return RaceResult.from_json(data)
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        raise InvalidSettingError(f"{path} is not a race saved by `specchat race --json` ({err}).") from err


class RaceProgress:
    """While the lanes are measured: how far each is, on stderr (one line per lane off a terminal)."""

    def __init__(self) -> None:
        self.tty = sys.stderr.isatty()
        self.lane = ""

    def __enter__(self) -> RaceProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.tty and self.lane:
            click.echo("", err=True)

    def __call__(self, lane: str, tokens: int) -> None:
        if lane != self.lane:
            if self.tty and self.lane:
                click.echo("", err=True)
            self.lane = lane
            if not self.tty:
                click.echo(f"specchat: measuring the {lane} lane…", err=True)
        if self.tty:
            click.echo(f"\rspecchat: measuring the {lane} lane: {tokens} tokens", err=True, nl=False)


def show_race(result: Any, replay: bool) -> None:
    """The replay at measured pace on a terminal (else the final frame), then the summary line."""
    import time

    from rich.console import Console
    from rich.live import Live

    from specchat.presenters.race_text import race_frame, summary_line

    console = Console(highlight=False)
    if replay and console.is_terminal:
        start = time.perf_counter()
        with Live(
            race_frame(result, 0.0, KIND_STYLES), console=console, refresh_per_second=REPLAY_FPS
        ) as live:
            while (t := time.perf_counter() - start) < result.duration_s:
                live.update(race_frame(result, t, KIND_STYLES))
                time.sleep(1 / REPLAY_FPS)
            live.update(race_frame(result, result.duration_s, KIND_STYLES))
    else:
        console.print(race_frame(result, result.duration_s, KIND_STYLES))
    click.echo(summary_line(result))


def race_svg(result: Any) -> str:
    from rich.console import Console

    from specchat.presenters.race_text import race_frame

    console = Console(record=True, width=140, force_terminal=True, file=open(os.devnull, "w"))  # noqa: SIM115
    console.print(race_frame(result, result.duration_s, KIND_STYLES))
    return console.export_svg(title="specchat race")
