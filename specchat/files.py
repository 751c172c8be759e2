"""Reading a file a user named (a conversation to replay, the config file, a prompt, a race), and
writing one whole or not at all (:func:`write_atomic`).

``Path.read_text`` reads until end of file. Named at ``/dev/zero`` (or a symlink to it) that is
never: the process grows until the kernel kills it, deaf to SIGTERM while it copies. Here only
regular files and pipes are read, and never more than a stated limit; anything else (a folder, a
device, a socket, a file over the limit) is refused at once with the reason.

Pipes and FIFOs stay allowed (``specchat replay <(zcat chat.json.gz)``), read with a time limit:
a FIFO is opened without blocking, and if nothing arrives for :data:`FIFO_WAIT_S` seconds (nobody
writes to it) it is refused with that reason, instead of hanging silently. Ctrl+C and SIGTERM
still end the wait. What a pipe delivers is capped too.

The refusals are ``OSError`` subclasses whose ``strerror`` and ``str()`` are the reason alone
("it is a device, not a file"), so callers that already turn ``OSError`` into one line keep
working: ``cannot read the conversation z.json: it is a device (/dev/zero), not a file.``

Pure Python: no torch, no textual.
"""

from __future__ import annotations

import errno
import os
import select
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path

MiB = 1024 * 1024

CONVERSATION_LIMIT = 256 * MiB
"""A saved conversation keeps every token's trace (its top candidates, its round's drafts): about
1 KB per token in the worst case measured. A 128k-token context filled by replies is then about
130 MB; the limit is twice that."""
RACE_LIMIT = 256 * MiB
"""A saved race holds two lanes of the same kind of trace as a conversation's reply."""
CONFIG_LIMIT = 1 * MiB
"""A settings file holds a few dozen lines; a megabyte is thousands of times that."""
PROMPT_LIMIT = 16 * MiB
"""Four times the text of a million-token context (about 4 bytes a token)."""
THEME_LIMIT = 1 * MiB
"""A theme is a palette of a few dozen colours."""

FIFO_WAIT_S = 10.0
"""Seconds a named pipe may stay silent (no writer yet, or a writer that sends nothing)."""

_CHUNK = 1 * MiB


class RefusedFile(OSError):
    """A path that names something other than a readable file of a sane size.

    ``str(err)`` and ``err.strerror`` are the reason alone, ready to follow "cannot read X: ".
    """

    def __init__(self, code: int, reason: str, path: Path) -> None:
        super().__init__(code, reason, str(path))

    def __str__(self) -> str:
        return str(self.strerror)


class RefusedFolder(RefusedFile, IsADirectoryError):
    """A folder where a file was expected (callers that name folders specially still can)."""


def _kind(mode: int) -> str | None:
    """What a path names, in words, if it is something other than a file or a pipe."""
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISREG(mode) or stat.S_ISFIFO(mode):
        return None
    return "not a regular file"


def _size_words(size: int) -> str:
    return f"{size / MiB:,.1f} MiB" if size >= MiB else f"{size:,} bytes"


def _refuse_kind(path: Path, mode: int) -> None:
    if stat.S_ISDIR(mode):
        raise RefusedFolder(errno.EISDIR, "it is a folder, not a file", path)
    kind = _kind(mode)
    if kind is None:
        return
    target = os.path.realpath(path)
    where = f" ({target})" if target != str(path) else ""
    raise RefusedFile(errno.EINVAL, f"it is {kind}{where}, not a file", path)


def _too_big(path: Path, limit: int, size: int | None = None) -> RefusedFile:
    what = f"{_size_words(size)}, more" if size is not None else "more"
    return RefusedFile(errno.EFBIG, f"it is too large ({what} than the {_size_words(limit)} allowed)", path)


def read_user_file(path: Path, limit: int) -> bytes:
    """The bytes of the regular file (or pipe) at ``path``, at most ``limit`` of them.

    Raises ``FileNotFoundError`` as ``open`` does, :class:`RefusedFolder` for a folder and
    :class:`RefusedFile` for a device, a socket or a file over ``limit``; other ``OSError`` s
    (permission denied) pass through unchanged.
    """
    mode = os.stat(path).st_mode
    _refuse_kind(path, mode)
    if stat.S_ISFIFO(mode):
        return _read_fifo(path, limit)
    with open(path, "rb") as handle:
        # Checked again on what was opened: the path may have been swapped since the stat.
        info = os.fstat(handle.fileno())
        _refuse_kind(path, info.st_mode)
        if stat.S_ISREG(info.st_mode) and info.st_size > limit:
            raise _too_big(path, limit, info.st_size)
        return _read_capped(handle.read, path, limit)


def _read_capped(read: Callable[[int], bytes], path: Path, limit: int) -> bytes:
    """Read in chunks and stop one byte past ``limit``: a pipe (or a /proc file that says it is
    empty) cannot make us hold more than that."""
    parts: list[bytes] = []
    total = 0
    while True:
        chunk = read(min(_CHUNK, limit + 1 - total))
        if not chunk:
            return b"".join(parts)
        parts.append(chunk)
        total += len(chunk)
        if total > limit:
            raise _too_big(path, limit)


def _read_fifo(path: Path, limit: int, wait: float = FIFO_WAIT_S) -> bytes:
    """A named pipe's bytes until its writer closes it, at most ``limit``; refused once it stays
    silent for ``wait`` seconds. Opened without blocking (an ``open`` that waits for a writer
    cannot time out), then polled: Linux reports nothing until a writer has come and gone."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        _refuse_kind(path, os.fstat(fd).st_mode)
        poller = select.poll()
        poller.register(fd, select.POLLIN | select.POLLHUP)

        def read(size: int) -> bytes:
            while poller.poll(wait * 1000):
                try:
                    return os.read(fd, size)
                except BlockingIOError:
                    continue
            raise RefusedFile(
                errno.ETIMEDOUT,
                f"it is a pipe (FIFO) that sent nothing for {wait:g} s (is anything writing to it)",
                path,
            )

        return _read_capped(read, path, limit)
    finally:
        os.close(fd)


def read_user_text(path: Path, limit: int) -> str:
    """:func:`read_user_file` decoded as UTF-8 (``UnicodeDecodeError`` as ``read_text`` raises it)."""
    return read_user_file(path, limit).decode("utf-8")


def require_regular_file(path: Path) -> None:
    """Refuse anything but a regular file, for readers that memory-map it (a GGUF): a pipe
    cannot be mapped and a device such as /dev/zero maps as an endless file. Raises as
    :func:`read_user_file` does."""
    mode = os.stat(path).st_mode
    _refuse_kind(path, mode)
    if stat.S_ISFIFO(mode):
        raise RefusedFile(errno.EINVAL, "it is a pipe; a GGUF must be a file on disk", path)


def write_atomic(path: Path, data: str | bytes) -> None:
    """Write ``data`` to ``path`` whole or not at all, durable once this returns.

    A temporary file with a unique name in the same folder (two writers never share one, and
    ``os.replace`` stays on one file system) is written, flushed to disk, then renamed over
    ``path``: a reader sees the old file or the new one, never half, even after a power cut. The
    temporary is removed when anything fails, Ctrl+C included. Raises ``OSError``.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data.encode("utf-8") if isinstance(data, str) else data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
