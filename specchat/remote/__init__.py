"""Attach to a speculative-decoding server over an OpenAI-compatible HTTP API.

:func:`connect` probes the server once (llama.cpp's ``llama-server``, vLLM, or any other
OpenAI-compatible server) and returns a :class:`RemoteBackend`, which streams replies as the
same events the local engine yields (:mod:`specchat.engine.events`), as far as the server
exposes what happened. :attr:`RemoteBackend.capabilities` says which figures are measured,
which are inferred and which the server does not report.

Nothing is sent anywhere unless the user passed ``--server`` (or set ``server`` in the config).
The API key comes only from the environment (``SPECCHAT_API_KEY``) and is never written anywhere.
Torch-free: front ends import it freely.
"""

from specchat.remote.server_backend import RemoteBackend, connect
from specchat.remote.server_errors import ServerError

__all__ = ["RemoteBackend", "ServerError", "connect"]
