"""Writing to the model cache safely while other specchat processes run and signals arrive.

Three rules, which every writer of the cache follows (``with entry_lock(dest): with staged(dest)``):

- **One writer per entry.** :func:`entry_lock` holds an exclusive lock on one cache entry while it
  is checked, written, loaded or deleted. A second process waits and says so.
- **No half-written entry ever has its final name.** :func:`staged` writes into a hidden
  temporary beside the entry and renames it into place only when complete. An exception, Ctrl+C
  or SIGTERM removes the temporary; so does a normal exit of the interpreter.
- **What a killed process left is swept, never what a live one is writing.** A temporary is named
  after its entry, whose lock its writer holds until it dies (the system releases the lock of a
  killed process). :func:`sweep_partials` removes a temporary only after taking that lock.

The locks come from `filelock` (flock on POSIX, msvcrt on Windows, released by the system when a
process dies): a well-kept library is safer than hand-written locking on three platforms.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from specchat.models.cache.paths import (
    LOCKS,
    PARTIAL,
    CacheError,
    cache_dir,
    cache_write_error,
    ensure_dir,
    kind_dirs,
    public_mode,
)

Notify = Callable[[str], None]
"""Receives one human line (waiting for another process, a temporary swept)."""

POLL_SECONDS = 0.5
"""How often a waiting process looks at the lock again (and lets its caller cancel)."""

_held: dict[tuple[int, Path], str] = {}
"""(thread, entry) for every entry lock this process holds, and what it is doing with it. Per
thread: another thread of this process asking for the same entry must wait like anyone else."""
_partials: set[Path] = set()
"""Temporaries this process is writing; removed at exit if still there."""
_registry_lock = threading.Lock()


class EntryBusy(Exception):
    """Another process holds the entry's lock (only raised when asked not to wait)."""

    def __init__(self, entry: Path, holder: str) -> None:
        super().__init__(holder)
        self.entry = entry
        self.holder = holder
        """"another specchat (pid 123) is converting qwen-coder-1.5b", as far as is known."""


def lock_path(entry: Path) -> Path:
    """``<root>/.locks/<kind>/<entry>.lock``: outside the kind folders, so listings never see it."""
    return cache_dir() / LOCKS / entry.parent.name / f"{entry.name}.lock"


@contextlib.contextmanager
def entry_lock(
    entry: Path,
    doing: str,
    *,
    notify: Notify | None = None,
    wait: bool = True,
    heartbeat: Callable[[], None] | None = None,
) -> Iterator[None]:
    """Hold the exclusive lock of one cache entry; `doing` says why, to whoever waits for it.

    Busy: with `wait`, tell `notify` once who holds it, then poll, calling `heartbeat` between
    tries (a TUI raises from it to cancel); without, raise EntryBusy. SIGTERM, while held in the
    main thread, raises KeyboardInterrupt so that temporaries are removed on the way out.
    """
    entry = entry.absolute()
    key = (threading.get_ident(), entry)
    if key in _held:  # a caller up the stack holds it already
        yield
        return
    path = lock_path(entry)
    ensure_dir(entry.parent)  # a file in the way says so here, before anything is read or written
    ensure_dir(path.parent)
    lock = FileLock(str(path))
    try:
        _acquire(lock, entry, doing, notify=notify, wait=wait, heartbeat=heartbeat)
    except OSError as err:
        raise cache_write_error(err, path) from err
    try:
        with _registry_lock:
            _held[key] = doing
        _write_owner(path, doing)
        with _sigterm_as_interrupt():
            yield
    finally:
        with _registry_lock:
            _held.pop(key, None)
        with contextlib.suppress(OSError):
            _owner_path(path).unlink()
        lock.release()


def _acquire(
    lock: FileLock,
    entry: Path,
    doing: str,
    *,
    notify: Notify | None,
    wait: bool,
    heartbeat: Callable[[], None] | None,
) -> None:
    try:
        lock.acquire(timeout=0)
        return
    except Timeout:
        holder = _holder(Path(lock.lock_file), entry)
    if not wait:
        raise EntryBusy(entry, holder)
    if notify is not None:
        notify(f"{holder}; waiting until it is done")
    while True:
        if heartbeat is not None:
            heartbeat()
        try:
            lock.acquire(timeout=POLL_SECONDS)
            return
        except Timeout:
            continue


def _owner_path(lock: Path) -> Path:
    return lock.with_name(lock.name + ".owner")


def _write_owner(lock: Path, doing: str) -> None:
    """A note for waiters: the lock file itself cannot carry it (each opener may truncate it)."""
    with contextlib.suppress(OSError):
        _owner_path(lock).write_text(f"{os.getpid()}\t{doing}\n")


def _holder(lock: Path, entry: Path) -> str:
    """ "another specchat (pid 123) is converting qwen-coder-1.5b", as well as its note tells."""
    try:
        pid, doing = _owner_path(lock).read_text().strip().split("\t", 1)
    except (OSError, ValueError):
        return f"another specchat is using {entry.name}"
    return f"another specchat (pid {pid}) is {doing}"


def set_doing(entry: Path, doing: str) -> None:
    """Update what waiters are told this process is doing with an entry it holds."""
    key = (threading.get_ident(), entry.absolute())
    if key in _held:
        _held[key] = doing
        _write_owner(lock_path(key[1]), doing)


def held_here(entry: Path) -> bool:
    """Whether the calling thread holds `entry`'s lock."""
    return (threading.get_ident(), entry.absolute()) in _held


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """Let SIGTERM unwind like Ctrl+C while the cache is being written.

    Its default action ends the process on the spot, skipping every `finally`, which used to leave
    gigabytes of temporaries behind. Only the main thread can handle signals, and a handler someone
    else installed (the chat's own) is left alone.
    """
    installed = (
        threading.current_thread() is threading.main_thread()
        and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    )
    if installed:
        signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        yield
    finally:
        if installed:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _raise_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt("terminated")


@contextlib.contextmanager
def staged(dest: Path, *, folder: bool) -> Iterator[Path]:
    """Yield a temporary file or folder beside `dest`; on success it replaces `dest` atomically.

    The caller must hold `dest`'s entry lock: the sweep of other processes relies on it. On any
    exception, Ctrl+C or SIGTERM the temporary is removed, and nothing else is touched.
    """
    if not held_here(dest):
        raise RuntimeError(f"staged({dest}) needs entry_lock({dest}) held by this process")
    ensure_dir(dest.parent)
    prefix = f".{dest.name}{PARTIAL}"
    try:
        if folder:
            tmp = Path(tempfile.mkdtemp(dir=dest.parent, prefix=prefix))
            os.chmod(tmp, public_mode(0o777))  # mkdtemp makes it private; the cache is plain user data
        else:
            fd, name = tempfile.mkstemp(dir=dest.parent, prefix=prefix)
            os.close(fd)
            tmp = Path(name)
            os.chmod(tmp, public_mode(0o666))
    except OSError as err:
        raise cache_write_error(err, dest.parent) from err
    with _registry_lock:
        _partials.add(tmp)
    try:
        yield tmp
        _replace(tmp, dest)
    finally:
        with _signals_deferred():
            remove(tmp)
            with _registry_lock:
                _partials.discard(tmp)


def _replace(tmp: Path, dest: Path) -> None:
    """Put `tmp` in `dest`'s place. An old folder is first renamed to a temporary of its own, so
    that at every instant `dest` is either the old entry, absent, or the complete new one."""
    if tmp.is_dir() and dest.exists():
        old = dest.with_name(f".{dest.name}{PARTIAL}old-{os.getpid()}-{time.monotonic_ns()}")
        with _registry_lock:
            _partials.add(old)
        try:
            os.rename(dest, old)
            os.rename(tmp, dest)
        finally:
            remove(old)
            with _registry_lock:
                _partials.discard(old)
    else:
        os.replace(tmp, dest)


@contextlib.contextmanager
def _signals_deferred() -> Iterator[None]:
    """Hold Ctrl+C and SIGTERM back while a temporary is removed, so a second press cannot cut
    the cleanup short; they are delivered right after. Main thread on POSIX only."""
    can_block = hasattr(signal, "pthread_sigmask") and threading.current_thread() is threading.main_thread()
    if not can_block:
        yield
        return
    signals = {signal.SIGINT, signal.SIGTERM}
    signal.pthread_sigmask(signal.SIG_BLOCK, signals)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, signals)


def remove(path: Path) -> int:
    """Delete a file or folder if present; returns the bytes it held."""
    size = disk_size(path)
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
    return size


def disk_size(path: Path) -> int:
    """Bytes held by a file, or by everything in a folder (links are not followed)."""
    try:
        if path.is_symlink() or not path.is_dir():
            return path.lstat().st_size
    except OSError:
        return 0
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += (Path(root) / name).lstat().st_size
    return total


@atexit.register
def _remove_partials_at_exit() -> None:
    """A normal exit (sys.exit from a signal handler included) leaves no temporary behind."""
    for tmp in list(_partials):
        remove(tmp)


@dataclass(frozen=True)
class Partial:
    """A temporary left in a kind folder: the entry it was for, and its size."""

    path: Path
    entry: Path
    size: int


def find_partials() -> list[Partial]:
    """Every temporary in the cache, whoever writes it (see :func:`sweep_partials`)."""
    found = []
    for kind in kind_dirs():
        with contextlib.suppress(OSError):
            for child in sorted(kind.iterdir()):
                entry = partial_entry(child)
                if entry is not None:
                    found.append(Partial(child, entry, disk_size(child)))
    return found


def partial_entry(path: Path) -> Path | None:
    """``.<entry>.partial-<random>`` -> ``<entry>`` beside it; None for anything else."""
    name = path.name
    if not name.startswith(".") or PARTIAL not in name:
        return None
    return path.with_name(name[1:].rsplit(PARTIAL, 1)[0])


def sweep_partials(notify: Notify | None = None) -> int:
    """Remove temporaries left by killed processes; returns the bytes freed.

    A temporary whose entry lock is held belongs to a live writer and is left alone. Never waits,
    so a start is never held up by another process's conversion.
    """
    freed = 0
    for partial in find_partials():
        if partial.path in _partials:
            continue  # this process is writing it
        try:
            with entry_lock(partial.entry, "removing an unfinished temporary", wait=False):
                freed += remove(partial.path)
        except (EntryBusy, CacheError):
            continue  # a live writer, or a cache we may not write to: not ours to touch
    if freed and notify is not None:
        notify(f"removed {freed / 1e6:,.0f} MB that an interrupted specchat left in the model cache")
    return freed
