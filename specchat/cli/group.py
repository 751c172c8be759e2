"""The `specchat` group: usage errors in one line, where settings live in --help, and the chat
when no command is given."""

from __future__ import annotations

import sys
from typing import Any

import click

from specchat import __version__
from specchat.cli.chat_command import chat
from specchat.cli.exits import INTERRUPTED, usage_error
from specchat.cli.options import debug_option


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


def _register_commands() -> None:
    from specchat.cli.bench_command import bench
    from specchat.cli.generate_command import generate
    from specchat.cli.models_command import models
    from specchat.cli.race_command import race
    from specchat.cli.replay_command import replay
    from specchat.cli.selftest_command import selftest

    for command in (chat, generate, replay, race, selftest, models, bench):
        main.add_command(command)


_register_commands()
