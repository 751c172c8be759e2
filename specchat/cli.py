"""The `specchat` command: chat (default), generate, race, selftest, models, bench.

Heavy imports (torch, transformers, textual) happen inside the commands, so `specchat --help`
is instant. Every SpecchatError becomes one line on stderr and exit status 2; Ctrl+C (or
SIGTERM) stops generation at the next round boundary, prints what was generated and exits
with 130 (143).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from specchat import __version__
from specchat.config import Settings, load_settings
from specchat.engine.race import WARM_UP_TOKENS
from specchat.engine.registry import DRAFT_STOP_BELOW, DRAFTER_NAMES, DRAFTERS, drafter_spec
from specchat.errors import InvalidSettingError, SpecchatError
from specchat.files import PROMPT_LIMIT, RACE_LIMIT, read_user_file, read_user_text
from specchat.presenters.kind_labels import KIND_STYLES, LEGEND_LABELS
from specchat.untrusted import masked, visible

if TYPE_CHECKING:
    from specchat.backend import Backend
    from specchat.engine.events import Event
    from specchat.engine.session import ChatEngine
    from specchat.remote import RemoteBackend

F = TypeVar("F", bound=Callable[..., Any])
INTERRUPTED = 130
"""Exit status after Ctrl+C (128 + SIGINT)."""
TERMINATED = 143
"""Exit status after SIGTERM (128 + SIGTERM)."""
UNEXPECTED = 1
"""Exit status after an unexpected error (its traceback is in the log file)."""
USER_ERROR = 2
"""Exit status after a bad flag, setting or input (click uses 2 for usage errors too)."""
PIPE_CLOSED = 141
"""Exit status when stdout's reader closed the pipe early (128 + SIGPIPE, as the shell reports)."""


def model_options(func: F) -> F:
    """Options shared by chat, generate and bench-like commands (None = take from settings)."""
    options = [
        click.option("--target", help="Target model: packaged name, HF folder, .gguf file or hub id."),
        click.option("--draft", help="Draft model sharing the target's tokenizer (same forms as --target)."),
        click.option(
            "--drafter",
            type=click.Choice(DRAFTER_NAMES),
            help="Who proposes tokens: "
            + "; ".join(f"{spec.name} ({spec.summary})" for spec in DRAFTERS)
            + ".",
        ),
        click.option(
            "--gamma",
            type=int,
            help="γ, tokens drafted per round (1–16), as the schedule reads it: fixed drafts up to γ "
            "every round (the draft model stops sooner where its most likely token had less than "
            f"{DRAFT_STOP_BELOW}); heuristic starts at γ, then moves within 1–16 (+2 after a round "
            "fully accepted, −1 otherwise); adaptive drafts γ (at most 3) in its first drafted round, "
            "then picks 0–16 itself.",
        ),
        click.option(
            "--gamma-schedule",
            "schedule",
            type=click.Choice(["fixed", "heuristic", "adaptive"]),
            help="γ schedule: fixed, heuristic (+2 / −1), adaptive (maximises measured speed).",
        ),
        click.option("--temperature", type=float, help="0 = greedy (verification by exact match)."),
        click.option("--top-k", type=int, help="Keep the k most likely tokens."),
        click.option("--top-p", type=float, help="Nucleus sampling mass in (0, 1]."),
        click.option("--seed", type=int, help="Random seed for sampling."),
        click.option("--max-new-tokens", type=int, help="Most tokens to generate per reply."),
        click.option("--system", "system_prompt", help="System prompt."),
        click.option(
            "--quant", type=click.Choice(["4bit", "8bit"]), help="Quantize the target (bitsandbytes)."
        ),
        click.option(
            "--cpu-path",
            help="CPU kernels (default auto): auto runs specchat's own kernels where this CPU can, "
            "on AVX-512 or AVX2 (gguf/q4+head32768: the target on its GGUF blocks, a 4-bit draft; "
            "SPECCHAT_CPU_ISA=avx512|avx2|scalar forces a variant), fbgemm's int8 on "
            "other CPUs (int8/dyn8+head32768) and none on a GPU or with --quant; none is stock "
            "fp32; or TARGET/DRAFT[+headN].",
        ),
        click.option("--device", help="auto, cpu, cuda or cuda:N."),
        click.option("--dtype", help="auto, float32, bfloat16 or float16."),
        click.option(
            "--server",
            metavar="URL",
            help="Attach to an OpenAI-compatible server (llama-server, vLLM, …) instead of loading "
            "models; the API key comes from SPECCHAT_API_KEY.",
        ),
    ]
    for option in reversed(options):
        func = option(func)
    return func


class Terminated(BaseException):
    """SIGTERM arrived where nothing could stop gracefully (loading, or a second signal).

    A BaseException, like KeyboardInterrupt: code that turns library errors into one-line
    messages (``except Exception``) must let it through, and every ``finally`` still runs.
    """


def reports_errors(func: F) -> F:
    """Turn user errors into one clear line and an exit status, never a traceback."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            with terminate_raises():
                return func(*args, **kwargs)
        except SpecchatError as err:
            # Messages may quote a server, a file or a path: never a key, never a live escape.
            click.secho(f"specchat: {visible(masked(str(err)))}", fg="red", err=True)
            sys.exit(err.exit_code)
        except KeyboardInterrupt:
            click.echo("\nspecchat: interrupted.", err=True)
            sys.exit(INTERRUPTED)
        except Terminated:
            click.echo("\nspecchat: stopped by SIGTERM.", err=True)
            sys.exit(TERMINATED)
        except BrokenPipeError:
            # The reader went away (`specchat generate … | head`): nothing to say, and
            # nothing more may be written to stdout, not even at exit.
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - lives until exit
            sys.exit(PIPE_CLOSED)
        except Exception as err:  # a bug or the environment: one line here, details in the log
            report_unexpected(err)
            sys.exit(UNEXPECTED)

    return wrapper  # type: ignore[return-value]


def report_unexpected(err: BaseException) -> None:
    from specchat import logs

    line = logs.log_unexpected("unexpected error", err)
    for traceback in logs.debug_tracebacks():  # with --debug
        click.echo(traceback, err=True)
    click.secho(f"specchat: {line}", fg="red", err=True)


@contextlib.contextmanager
def terminate_raises() -> Iterator[None]:
    """SIGTERM raises Terminated, as Ctrl+C raises KeyboardInterrupt: the command unwinds (files
    in progress are cleaned up), prints one line and exits 143, instead of dying mid-write."""

    def handler(signum: int, frame: Any) -> None:
        raise Terminated

    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers can only be set from the main thread
        return
    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def settings_from(options: dict[str, Any]) -> Settings:
    return load_settings({k: v for k, v in options.items() if v is not None})


class SpecchatGroup(click.Group):
    """The `specchat` group: usage errors in one line, and where settings live in --help."""

    def main(self, *args: Any, **kwargs: Any) -> Any:
        kwargs["standalone_mode"] = False
        try:
            result = super().main(*args, **kwargs)
        except click.exceptions.Exit as done:  # --help, --version
            sys.exit(done.exit_code)
        except click.ClickException as err:
            sys.exit(usage_error(err))
        except click.exceptions.Abort:
            click.echo("\nspecchat: interrupted.", err=True)
            sys.exit(INTERRUPTED)
        return result

    def format_epilog(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        from specchat.config import config_path, data_dir

        with formatter.section("Files"):
            formatter.write_dl(
                [
                    ("settings", f"{config_path()} (SPECCHAT_CONFIG names another file)"),
                    ("conversations", f"{data_dir() / 'conversations'} (SPECCHAT_DATA_DIR moves the folder)"),
                    ("log", f"{data_dir() / 'logs' / 'specchat.log'} (tracebacks of unexpected errors)"),
                ]
            )
        formatter.write_paragraph()
        formatter.write_text(
            "Every option of chat and generate can be set in the settings file or as "
            "SPECCHAT_<NAME>; flags win. Exit status: 0 done, 1 unexpected error, 2 bad input, "
            "130 Ctrl+C, 141 output pipe closed, 143 SIGTERM."
        )


def usage_error(err: click.ClickException) -> int:
    """A click error (unknown option, wrong type, bad choice) as one line; returns its status."""
    message = err.format_message().replace("\n", " ")
    ctx = getattr(err, "ctx", None)
    hint = f" See '{ctx.command_path} --help'." if ctx is not None else ""
    click.secho(f"specchat: {message}{hint}", fg="red", err=True)
    return err.exit_code if err.exit_code else USER_ERROR


def debug_option(func: F) -> F:
    def enable(ctx: click.Context, param: click.Parameter, value: bool) -> None:
        if value:
            from specchat import logs

            logs.set_debug(True)

    return click.option(
        "--debug",
        is_flag=True,
        expose_value=False,
        is_eager=True,
        callback=enable,
        help="Also print the traceback of an unexpected error (it is always in the log file).",
    )(func)


@click.group(
    cls=SpecchatGroup,
    invoke_without_command=True,
    context_settings={"help_option_names": ["-h", "--help"]},
)
@click.version_option(__version__, prog_name="specchat")
@click.option(
    "--server",
    metavar="URL",
    help="Attach to an OpenAI-compatible server instead of loading models (any command).",
)
@debug_option
@click.pass_context
def main(ctx: click.Context, server: str | None) -> None:
    """Chat with a local LLM and watch speculative decoding work, token by token.

    With no command, opens the chat with the packaged default pair (or attaches to --server).
    """
    if server:
        # `specchat --server URL [command]`: the command's own --server defaults to it.
        # race and selftest take it too, to refuse it in one line rather than ignore it.
        commands = ("chat", "generate", "bench", "race", "selftest")
        ctx.default_map = {name: {"server": server} for name in commands}
    if ctx.invoked_subcommand is None:
        ctx.invoke(chat, server=server)


@main.command()
@model_options
@click.option("--theme", help="Theme name (see themes/).")
@debug_option
@reports_errors
def chat(**options: Any) -> None:
    """Open the chat (the default command)."""
    settings = settings_from(options)
    from specchat.ui.app import run_chat
    from specchat.ui.themes import check_theme_name

    if options.get("theme") is not None:
        check_theme_name(options["theme"])
    sys.exit(run_chat(settings))


@main.command()
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
    from specchat.ui.themes import check_theme_name

    if theme is not None:
        check_theme_name(theme)
    sys.exit(run_replay(settings, file, float(speed)))


@main.command()
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
    controls = controls_from(settings)
    controls.validate()
    engine: Backend
    if settings.server:
        engine = connect_server(settings)
    else:
        check_draft_model(settings)
        engine = load_engine(settings)
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


def read_prompt(prompt: str | None, prompt_file: str | None) -> str:
    """The prompt as text, checked before any model loads: one clear line when it is unusable."""
    if prompt is not None and prompt_file is not None:
        raise InvalidSettingError("give the prompt once: either PROMPT or --prompt-file, not both.")
    if prompt_file is not None:
        text = decode_prompt(read_prompt_file(prompt_file), f"the prompt file {prompt_file}")
    elif prompt == "-":
        text = decode_prompt(sys.stdin.buffer.read(), "standard input")
    elif prompt is not None:
        text = check_prompt_argument(prompt)
    else:
        raise InvalidSettingError(
            "no prompt: pass PROMPT, '-' to read standard input, or --prompt-file FILE."
        )
    if not text.strip():
        raise InvalidSettingError("the prompt is empty: pass some text, or '-' to read it from stdin.")
    return text


def read_prompt_file(name: str) -> bytes:
    if name == "-":
        return sys.stdin.buffer.read()
    try:
        return read_user_file(Path(name), PROMPT_LIMIT)
    except FileNotFoundError as err:
        raise InvalidSettingError(f"the prompt file {name} does not exist.") from err
    except IsADirectoryError as err:
        raise InvalidSettingError(f"the prompt file {name} is a folder: name a text file.") from err
    except OSError as err:
        raise InvalidSettingError(f"cannot read the prompt file {name}: {err.strerror or err}.") from err


def decode_prompt(data: bytes, where: str) -> str:
    if b"\x00" in data:
        raise InvalidSettingError(f"{where} looks binary (it holds NUL bytes): the prompt must be text.")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise InvalidSettingError(
            f"{where} is not UTF-8 text (byte {data[err.start]:#04x} at offset {err.start}): "
            "convert it first, e.g. with iconv -t UTF-8."
        ) from err


def check_prompt_argument(prompt: str) -> str:
    """Bytes that are not UTF-8 reach argv as lone surrogates: refuse them before loading."""
    try:
        prompt.encode("utf-8")
    except UnicodeEncodeError as err:
        byte = ord(prompt[err.start]) - 0xDC00 if 0xDC80 <= ord(prompt[err.start]) <= 0xDCFF else None
        what = f"byte {byte:#04x}" if byte is not None else f"character {prompt[err.start]!r}"
        raise InvalidSettingError(
            f"the prompt argument is not UTF-8 text ({what} at position {err.start}): "
            "check your terminal's encoding, or pass the text with --prompt-file."
        ) from err
    return prompt


def controls_from(settings: Settings) -> Any:
    from specchat.engine.session import Controls

    return Controls(
        gamma=settings.gamma,
        schedule=settings.schedule,
        drafter=settings.drafter,
        temperature=settings.temperature,
        top_k=settings.top_k,
        top_p=settings.top_p,
        max_new_tokens=settings.max_new_tokens,
        seed=settings.seed,
    )


def check_draft_model(settings: Settings) -> None:
    """Before loading anything: a drafter that needs the draft model needs one named."""
    if drafter_spec(settings.drafter).needs_draft_model and not settings.draft:
        raise InvalidSettingError(
            f"--drafter {settings.drafter} needs a draft model: pass --draft, or use --drafter ngram."
        )


def load_engine(settings: Settings) -> ChatEngine:
    """Load the target (and the draft, only for the model and hybrid drafters), on the chosen kernels."""
    from specchat.engine.session import ChatEngine
    from specchat.models import load_for_decoding

    needs_draft = drafter_spec(settings.drafter).needs_draft_model
    draft = settings.draft if needs_draft else None
    if needs_draft and not draft:
        raise InvalidSettingError(
            f"--drafter {settings.drafter} needs a draft model: pass --draft, or use --drafter ngram."
        )
    with LoadProgressPrinter() as progress:
        pair = load_for_decoding(
            settings.target,
            draft,
            device=settings.device,
            dtype=settings.dtype,
            quant=settings.quant,
            cpu_path=settings.cpu_path,
            progress=progress,
        )
    return ChatEngine(pair.target, pair.tokenizer, pair.draft)


def connect_server(settings: Settings) -> RemoteBackend:
    """Attach to ``settings.server`` (probing what it is) and say on stderr what it cannot report."""
    from specchat.remote import connect

    assert settings.server
    click.echo(f"specchat: connecting to {settings.server}…", err=True)
    backend = connect(settings.server, timeout=settings.server_timeout, verify=settings.server_verify_tls)
    click.echo(f"specchat: attached to {backend.label}.", err=True)
    for note in backend.notes:
        click.echo(f"specchat: note: {visible(masked(note))}", err=True)
    return backend


class stop_on_signals:
    """While a reply streams, the first Ctrl+C or SIGTERM asks the engine to stop after the
    current round: what was generated is printed, with its summary. A second one aborts."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self, cancel: threading.Event) -> None:
        self.cancel = cancel
        self.received: int | None = None
        self.previous: dict[int, Any] = {}

    def _handler(self, signum: int, frame: Any) -> None:
        if self.cancel.is_set():
            raise KeyboardInterrupt if signum == signal.SIGINT else Terminated
        self.received = signum
        self.cancel.set()

    @property
    def exit_status(self) -> int:
        return TERMINATED if self.received == signal.SIGTERM else INTERRUPTED

    def __enter__(self) -> stop_on_signals:
        self.previous = {signum: signal.signal(signum, self._handler) for signum in self.SIGNALS}
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)


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
        if event.stage == "notice":  # worth keeping (a damaged cache rebuilt): above the bar, every one
            self.console.print(f"specchat: {event.message}", markup=False, highlight=False, soft_wrap=True)
            return
        if not self.console.is_terminal:  # a log, not a bar: one line per stage of each model
            step = f"{event.model}:{event.stage}"
            if step != self.last_step:
                click.echo(f"specchat: {event.message}", err=True)
            self.last_step = step
            return
        if self.task is None:
            self.task = self.progress.add_task(event.message, total=event.total)
        self.progress.update(self.task, description=event.message, completed=event.done, total=event.total)


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


REPLAY_FPS = 20
SELFTEST_TEMPERATURE = 1.0
"""The sampling self-test's temperature unless --temperature is given (0 checks greedy equality)."""
SELFTEST_GREEDY_TOKENS = 48


@main.command()
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
        if settings.server:
            raise InvalidSettingError(
                "the race needs local models (it times every token itself): for a server, "
                "use `specchat bench --server URL --baseline-server URL`."
            )
        controls = controls_from(settings)
        controls.validate()
        if controls.drafter == "none":
            raise InvalidSettingError("--drafter none drafts nothing: both lanes would be plain decoding.")
        check_draft_model(settings)
        engine = load_engine(settings)
        messages = [{"role": "system", "content": settings.system_prompt}] if settings.system_prompt else []
        messages.append({"role": "user", "content": prompt})
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
        write_output(json_path, json.dumps(result.to_json(), ensure_ascii=False, indent=1) + "\n")
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


def write_output(path: str, text: str) -> None:
    try:
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(text)
    except OSError as err:
        raise InvalidSettingError(f"cannot write {path}: {err.strerror or err}.") from err


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


@main.command()
@model_options
@click.option(
    "--samples",
    type=click.IntRange(1),
    default=2000,
    show_default=True,
    help="Samples per lane (at T > 0); tiny models manage 100000.",
)
@click.option(
    "--tokens",
    type=click.IntRange(1, 4),
    default=2,
    show_default=True,
    help="Reply tokens per sample: each distinct sequence is one outcome.",
)
@click.option("--prompt", "selftest_prompt", metavar="TEXT", help="The fixed prompt sampled (at T > 0).")
@click.option("--json", "json_path", metavar="FILE", help="Save the result as JSON.")
@debug_option
@reports_errors
def selftest(
    samples: int, tokens: int, selftest_prompt: str | None, json_path: str | None, **options: Any
) -> None:
    """Check on this machine that speculative decoding samples exactly what the target samples.

    At T > 0 (T = 1 unless --temperature is given) it samples the first tokens of a reply to a
    fixed prompt again and again, by speculative decoding (the current drafter and γ) and by the
    target alone, and compares the two histograms: total variation distance against its
    sampling-noise band, and a chi-square test. At --temperature 0 it checks token-for-token
    equality on a few prompts instead. Exit status 1 when the check finds a difference.
    """
    from specchat.engine.selftest import SELFTEST_PROMPT

    if options.get("temperature") is None:
        options["temperature"] = SELFTEST_TEMPERATURE
    greedy = options["temperature"] == 0
    if greedy and options.get("max_new_tokens") is None:
        options["max_new_tokens"] = SELFTEST_GREEDY_TOKENS
    prompt = check_prompt_argument(selftest_prompt) if selftest_prompt is not None else SELFTEST_PROMPT
    if not prompt.strip():
        raise InvalidSettingError("the prompt is empty: pass some text with --prompt, or leave it out.")
    settings = settings_from(options)
    if settings.server:
        raise InvalidSettingError("the self-test needs local models: a server returns no token ids to count.")
    controls = controls_from(settings)
    controls.validate()
    if controls.drafter == "none":
        raise InvalidSettingError("--drafter none drafts nothing: there would be nothing to test.")
    check_draft_model(settings)
    engine = load_engine(settings)
    cancel = threading.Event()
    with stop_on_signals(cancel) as signals:
        if greedy:
            ok, data = run_greedy_selftest(engine, controls, settings.system_prompt, cancel)
        else:
            ok, data = run_sampling_selftest(
                engine, controls, prompt, settings.system_prompt, samples, tokens, cancel
            )
    if json_path is not None:
        write_output(json_path, json.dumps(data, ensure_ascii=False, indent=1) + "\n")
        click.echo(f"specchat: self-test saved to {json_path}", err=True)
    if cancel.is_set():
        sys.exit(signals.exit_status)
    if not ok:
        sys.exit(UNEXPECTED)


def run_greedy_selftest(
    engine: Any, controls: Any, system_prompt: str | None, cancel: threading.Event
) -> tuple[bool, dict[str, Any]]:
    from specchat.engine.selftest import greedy_equality

    checks = []
    for check in greedy_equality(engine, controls, system_prompt=system_prompt, cancel=cancel):
        checks.append(check)
        verdict = "identical" if check.identical else f"DIFFERENT from token {check.first_difference}"
        alpha = "–" if check.alpha is None else f"{check.alpha:.2f}"
        click.echo(f"{verdict:<12} {len(check.plain_ids):>4} tokens · α {alpha} · {check.prompt}")
    ok = all(check.identical for check in checks)
    what = "token for token identical" if ok else "NOT identical: speculative decoding changed the text"
    click.echo(
        f"selftest (T = 0, γ {controls.gamma}, drafter {controls.drafter}): {len(checks)} prompts {what}"
    )
    return ok, {"type": "selftest", "temperature": 0.0, "checks": [c.to_json() for c in checks]}


def run_sampling_selftest(
    engine: Any,
    controls: Any,
    prompt: str,
    system_prompt: str | None,
    samples: int,
    tokens: int,
    cancel: threading.Event,
) -> tuple[bool, dict[str, Any]]:
    from specchat.engine.selftest import ExactnessSampler, selftest_messages
    from specchat.presenters.selftest_text import progress_line, report_lines

    sampler = ExactnessSampler(
        engine, selftest_messages(prompt, system_prompt), controls, tokens=tokens, seed=controls.seed or 0
    )
    tty = sys.stderr.isatty()

    def show(report: Any) -> None:
        if tty:
            click.echo(f"\r{progress_line(report, samples)}\x1b[K", err=True, nl=False)

    report = sampler.run(samples, cancel=cancel, on_report=show, report_every=0.5 if tty else 1e9)
    if tty:
        click.echo("", err=True)
    for line in report_lines(report):
        click.echo(line)
    return report.consistent, report.to_json()


@main.command()
@click.option(
    "--clear",
    "clear_name",
    metavar="NAME|all",
    help="Delete what the cache holds for NAME (every kind of file), or all of it; asks first.",
)
@click.option(
    "--verify",
    "verify_name",
    metavar="[NAME]",
    is_flag=False,
    flag_value="all",
    help="Hash every cached file against its record (seconds per GB); damaged ones are removed, "
    "so the next start rebuilds them.",
)
@click.option(
    "--kind", "kinds", multiple=True, metavar="KIND", help="With --clear or --verify: only this kind."
)
@click.option("--yes", "-y", is_flag=True, help="Clear without asking.")
@reports_errors
def models(clear_name: str | None, verify_name: str | None, kinds: tuple[str, ...], yes: bool) -> None:
    """List the packaged models and what the cache holds for each; clear or verify the cache.

    Exit status: 0 done; 1 nothing deleted (declined), something skipped (another specchat is
    using it) or something found damaged; 2 a bad name or kind.
    """
    from specchat.models import list_models
    from specchat.models.cache import human_bytes

    if kinds and not (clear_name or verify_name):
        raise InvalidSettingError("--kind goes with --clear or --verify (e.g. --clear all --kind converted).")
    if clear_name:
        sys.exit(_clear_cache(clear_name, kinds, yes))
    if verify_name:
        sys.exit(_verify_cache(verify_name, kinds))
    infos = list_models()
    width = max(20, *(len(info.name) + 1 for info in infos))
    click.echo(f"{'name':<{width}} {'kind':<9} {'role':<7} {'installed':<9} {'cached':<6} {'size':<8} about")
    for info in infos:
        size = human_bytes(info.size_bytes) if info.size_bytes else "–"
        click.echo(
            f"{info.name:<{width}} {info.kind:<9} {info.role:<7} {'yes' if info.installed else 'no':<9} "
            f"{'yes' if info.cached else 'no':<6} {size:<8} {info.description}"
        )
    click.echo()
    click.echo(_kernels_line())
    _print_cache_usage()


def _kernels_line() -> str:
    """Which of specchat's CPU kernel variants a start on this machine runs, or why none can."""
    from specchat.kernels import ISA_ENV, cpu_supports, variant
    from specchat.models.cpu_quant import FALLBACK_CPU_PATH

    reason = cpu_supports()
    if reason is not None and os.environ.get(ISA_ENV):
        return f"CPU kernels: none ({reason}); a start refuses until {ISA_ENV} names one this CPU runs"
    if reason is not None:
        return f"CPU kernels: none ({reason}); the CPU path falls back to {FALLBACK_CPU_PATH}"
    forced = f", forced by {ISA_ENV}" if os.environ.get(ISA_ENV) else ""
    return f"CPU kernels: {variant()}{forced} (the instruction set the packed models run on)"


def _print_cache_usage() -> None:
    from specchat.models.cache import cache_dir, human_bytes
    from specchat.models.usage import UNFINISHED, cache_items, usage

    root = cache_dir()
    items = cache_items()
    if root.exists() and not root.is_dir():
        click.echo(f"cache: {root} is a file, not a folder; move it away or set SPECCHAT_CACHE_DIR")
        return
    if not items:
        click.echo(f"cache: {root} (empty)")
        return
    kinds, rows = usage(items)
    click.echo(f"cache: {root} ({human_bytes(sum(row.total for row in rows))})")
    width = max(len(row.owner) for row in [*rows]) + 2
    click.echo(f"{'model':<{width}}" + "".join(f"{kind:<11}" for kind in kinds) + "total")
    for row in rows:
        cells = "".join(f"{human_bytes(row.by_kind[k]) if k in row.by_kind else '–':<11}" for k in kinds)
        click.echo(f"{row.owner:<{width}}{cells}{human_bytes(row.total)}")
    if any(row.owner == UNFINISHED for row in rows):
        click.echo(f"{UNFINISHED}: left by an interrupted run (removed at the next start), or being written")
    click.echo("free space: specchat models --clear NAME|all [--kind KIND]")
    click.echo("check every byte: specchat models --verify [NAME]")


def _chosen_items(name: str, kinds: tuple[str, ...]) -> list[Any]:
    """The cache items NAME (or all) and --kind mean; a name or kind that matches nothing is a user
    error, except a packaged model with nothing cached yet."""
    from specchat.models import PACKAGED
    from specchat.models.usage import UNFINISHED, cache_items, select, usage

    items = cache_items()
    owners = [row.owner for row in usage(items)[1] if row.owner != UNFINISHED]
    present = sorted({item.kind for item in items})
    unknown = [kind for kind in kinds if kind not in present]
    if unknown:
        raise InvalidSettingError(
            f"no {unknown[0]!r} in the cache; kinds present: {', '.join(present) or 'none (it is empty)'}"
        )
    if name != "all" and name not in owners and name != UNFINISHED and name not in PACKAGED:
        raise InvalidSettingError(
            f"nothing cached under {name!r}; cached: {', '.join(owners) or 'nothing'} (or `all`)"
        )
    return select(items, name, kinds)


def _clear_cache(name: str, kinds: tuple[str, ...], yes: bool) -> int:
    from specchat.models.cache import human_bytes
    from specchat.models.usage import clear

    chosen = _chosen_items(name, kinds)
    if not chosen:
        click.echo(f"nothing cached for {name}" if name != "all" else "the cache is empty; nothing to clear")
        return 0
    total = sum(item.size for item in chosen)
    for item in chosen:
        click.echo(f"  {item.owner} ({item.kind}): {item.path} · {human_bytes(item.size)}")
    if not yes:
        try:
            question = f"Delete {human_bytes(total)} from the model cache?"
            agreed = click.confirm(question, default=False, err=True)
        except click.Abort:
            click.echo("\nspecchat: nothing deleted (pass --yes to clear without asking).", err=True)
            return 1
        if not agreed:
            click.echo("specchat: nothing deleted.", err=True)
            return 1
    report = clear(chosen)
    click.echo(f"freed {human_bytes(report.freed)}")
    for item, why in report.skipped:
        click.echo(
            f"specchat: skipped {item.owner} ({item.kind}): {why}; close it, or clear again when it is done",
            err=True,
        )
    return 1 if report.skipped else 0


def _verify_cache(name: str, kinds: tuple[str, ...]) -> int:
    from specchat.models.store import EntryBusy, entry_lock
    from specchat.models.usage import LAYOUT_ONLY, NOT_CHECKED, clear, verifiable, verify

    damaged = 0
    for item in verifiable(_chosen_items(name, kinds)):
        click.echo(f"{item.owner} ({item.kind}): ", nl=False)  # the verdict follows once hashed
        try:
            with entry_lock(item.guard, "verifying the cache", wait=False):
                problem = verify(item)
        except EntryBusy as busy:
            click.echo(f"not checked, {busy.holder}")
            continue
        if problem is None:
            click.echo("ok")
        elif problem in (NOT_CHECKED, LAYOUT_ONLY):
            click.echo(problem)
        else:
            damaged += 1
            removed = not clear([item]).skipped
            outcome = "removed, the next start rebuilds it" if removed else "could not remove it"
            click.echo(f"damaged ({problem}); {outcome}")
    return 1 if damaged else 0


def _register_bench() -> None:
    try:
        from specchat.bench.cli import bench
    except ImportError:  # the bench ships with specchat; missing only in a broken install
        return
    main.add_command(bench)


_register_bench()
