"""Errors talking to a server: each one a single line the user can act on."""

from __future__ import annotations

from specchat.errors import SpecchatError
from specchat.untrusted import masked, visible


class ServerError(SpecchatError):
    """A bad URL, a refused connection, a timeout, an HTTP error or a stream cut mid-reply.

    The message is masked and made visible once more as it is made: the parts quoted from the
    server are neutralised (and clipped) where they are quoted, and this catches any that were
    not, so no front end that prints ``str(err)`` can show the API key or obey an escape sequence.
    """

    def __init__(self, message: str) -> None:
        super().__init__(visible(masked(message)))
