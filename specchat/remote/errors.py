"""Errors talking to a server: each one a single line the user can act on."""

from __future__ import annotations

from specchat.errors import SpecchatError


class ServerError(SpecchatError):
    """A bad URL, a refused connection, a timeout, an HTTP error or a stream cut mid-reply."""
