"""Exit statuses and how a command ends: one line for a user error, Ctrl+C and SIGTERM stop at
the next round boundary, an unexpected error is logged with its traceback."""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import click

from specchat.errors import InvalidSettingError, SpecchatError
from specchat.untrusted import masked, visible

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


def usage_error(err: click.ClickException) -> int:
    """A click error (unknown option, wrong type, bad choice) as one line; returns its status."""
    message = err.format_message().replace("\n", " ")
    ctx = getattr(err, "ctx", None)
    hint = f" See '{ctx.command_path} --help'." if ctx is not None else ""
    click.secho(f"specchat: {message}{hint}", fg="red", err=True)
    return err.exit_code if err.exit_code else USER_ERROR


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


def write_output(path: str, text: str) -> None:
    try:
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(text)
    except OSError as err:
        raise InvalidSettingError(f"cannot write {path}: {err.strerror or err}.") from err
