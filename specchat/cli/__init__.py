"""The `specchat` command: chat (default), generate, replay, race, selftest, models, bench.

One module per command (``*_command.py``, the bench's too: :mod:`specchat.bench` holds what it
runs and never imports the CLI), the group in :mod:`specchat.cli.group`, the options they share
in :mod:`specchat.cli.options`.
Every command opens its backend through :func:`specchat.opening.open_backend`.

Heavy imports (torch, transformers, textual) happen inside the commands, so `specchat --help`
is instant. Every SpecchatError becomes one line on stderr and exit status 2; Ctrl+C (or
SIGTERM) stops generation at the next round boundary, prints what was generated and exits
with 130 (143).
"""

from specchat.cli.group import main

__all__ = ["main"]
