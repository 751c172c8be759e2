"""Loading the models (or attaching to a server) in a thread worker, reported as messages.

The app starts :func:`load_models` behind its loading screen; progress, failure and the loaded
engine come back only through ``post`` (thread-safe), never by touching widgets.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from textual.message import Message
from textual.worker import get_current_worker

from specchat import logs
from specchat.errors import SpecchatError
from specchat.ui.workers import bridge
from specchat.ui.workers.messages import EngineLoaded, LoadFailed, LoadProgressed

if TYPE_CHECKING:
    from specchat.config import Settings
    from specchat.models import LoadProgress


class LoadCancelled(BaseException):
    """Raised from the progress callback to abandon loading when the app quits.

    A BaseException, like KeyboardInterrupt: it is not an error, and the loader's handlers
    that turn library errors into one-line messages must let it through.
    """


def load_models(settings: Settings, post: Callable[[Message], object]) -> None:
    """Run in the app's "engine" worker: load, reporting each stage; stop when the worker is cancelled."""
    worker = get_current_worker()

    def progress(event: LoadProgress) -> None:
        if worker.is_cancelled:
            raise LoadCancelled
        post(LoadProgressed(event))

    try:
        loaded = bridge.load_backend(settings, progress)
    except LoadCancelled:
        return
    except SpecchatError as err:
        post(LoadFailed(str(err), err.exit_code))
        return
    except Exception as err:  # shown as one line; the traceback goes to the log file
        what = "attach to the server" if settings.server else "load the models"
        post(LoadFailed(logs.log_unexpected(f"could not {what}", err), 1))
        return
    post(EngineLoaded(loaded))
