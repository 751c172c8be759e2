"""A safetensors file written a tensor (or a range of a tensor's rows) at a time.

safetensors' own writers take every tensor at once, so packing a 7B model that way held the whole
packed copy in memory, and its bytes a second time while writing (2.3x the GGUF at peak). Here
each array is written at its place as soon as it is packed and then dropped. The header, which
must come first, is written last into room reserved at the start (the format lets a header end in
spaces); tensors start on 64-byte boundaries, the gaps held by small "__pad" tensors (the format
allows no unlisted bytes), which loading skips.

The bytes reach the file on a thread of their own, a bounded amount behind: writing a 7B model's
4.8 GB goes at the disk's pace once the kernel's dirty-page limit is reached (about 10 s here),
while the native repacking that produces them takes about 3 s and reading the tokenizer from the
GGUF about 8 s of the interpreter. Waiting for each write in turn added those times up.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import threading
from collections import deque
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np

PAD_PREFIX = "__pad."
ALIGN = 64
"""Every tensor starts on a cache line (the kernels' vector loads, and torch's views of the map)."""

DTYPES = {
    np.dtype(np.uint8): "U8",
    np.dtype(np.int8): "I8",
    np.dtype(np.float16): "F16",
    np.dtype(np.float32): "F32",
    np.dtype(np.int32): "I32",
    np.dtype(np.int64): "I64",
    np.dtype(np.uint16): "U16",
    np.dtype(np.int16): "I16",
}


IN_FLIGHT = 256 * 1024 * 1024
"""Bytes handed to the writing thread and not yet written, at most: what streaming adds to the
peak memory of packing (a caller handing more waits)."""

HEADER_ROOM = 2 * 1024 * 1024
"""Bytes reserved for the header: a 14B model's (about 3,500 entries of under 150 bytes, and the
model's record) fits several times over; a larger one still works, by moving the data once (see
:meth:`StreamedSafetensors.close`)."""


class StreamedSafetensors:
    """Write ``path`` as a safetensors file; use as a context manager, then :meth:`close` with the
    file's metadata. The file is complete only once closed (the caller writes it into a staged
    temporary, so an interrupted packing leaves nothing that passes for a finished copy)."""

    def __init__(self, path: Path, room: int) -> None:
        self.path = path
        self._room = -(-room // ALIGN) * ALIGN - 8  # the data then starts on a boundary too
        self._file = path.open("wb")
        self._entries: dict[str, dict[str, Any]] = {}
        self._row_bytes: dict[str, int] = {}
        self._end = 0
        self._pads = 0
        self._pending: deque[tuple[memoryview, int, np.ndarray] | None] = deque()
        self._pending_bytes = 0
        self._changed = threading.Condition()
        self._failure: BaseException | None = None
        self._writer = threading.Thread(target=self._write_pending, name="specchat-pack-writer", daemon=True)
        self._writer.start()

    def __enter__(self) -> StreamedSafetensors:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self._stop_writer(drain=False)
        self._file.close()

    def _write_pending(self) -> None:
        """The writing thread: each handed range at its place, in turn, until told to stop."""
        while True:
            with self._changed:
                while not self._pending:
                    self._changed.wait()
                item = self._pending[0]
            if item is None:
                return
            view, at, _keep = item
            size = len(view)
            try:
                while view:
                    written = os.pwrite(self._file.fileno(), view, at)
                    view, at = view[written:], at + written
            except BaseException as err:  # handed to the packing thread at its next call
                with self._changed:
                    self._failure = err
                    self._pending.clear()
                    self._pending_bytes = 0
                    self._changed.notify_all()
                return
            with self._changed:
                # A stop that does not drain clears the queue while a range is being written and
                # hands the thread its None: that must stay for the loop to find, not be popped.
                if self._pending and self._pending[0] is item:
                    self._pending.popleft()
                    self._pending_bytes -= size
                self._changed.notify_all()

    def _hand_over(self, view: memoryview, at: int, keep: np.ndarray) -> None:
        with self._changed:
            while self._failure is None and 0 < self._pending_bytes > IN_FLIGHT - len(view):
                self._changed.wait()
            self._raise_failure()
            self._pending.append((view, at, keep))
            self._pending_bytes += len(view)
            self._changed.notify_all()

    def _raise_failure(self) -> None:
        if self._failure is not None:
            raise self._failure

    def _stop_writer(self, drain: bool) -> None:
        """Stop the writing thread: once every handed range is written (``drain``), or at once."""
        with self._changed:
            if not drain:
                self._pending.clear()
                self._pending_bytes = 0
            self._pending.append(None)
            self._changed.notify_all()
        self._writer.join()
        with self._changed:
            self._pending.clear()

    def add(self, name: str, array: np.ndarray) -> None:
        """A whole tensor (of one dimension or more)."""
        self.write_rows(name, array, 0, len(array))

    def write_rows(self, name: str, rows: np.ndarray, first: int, total: int) -> None:
        """Rows ``first``… of the tensor ``name`` of ``total`` rows (room for all of them is
        taken when its first rows come; any order of ranges after that)."""
        rows = np.ascontiguousarray(rows)
        if name not in self._entries:
            self._place(name, rows, total)
        entry = self._entries[name]
        if rows.dtype != np.dtype(entry["numpy"]) or list(rows.shape[1:]) != entry["shape"][1:]:
            raise ValueError(f"{name}: rows of {rows.dtype} {rows.shape[1:]} for {entry['shape']}")
        if first + len(rows) > total:
            raise ValueError(f"{name}: rows {first}..{first + len(rows)} of {total}")
        at = 8 + self._room + entry["data_offsets"][0] + first * self._row_bytes[name]
        self._hand_over(memoryview(rows.reshape(-1).view(np.uint8).data), at, rows)

    def _place(self, name: str, rows: np.ndarray, total: int) -> None:
        if name in self._entries or name.startswith(PAD_PREFIX):
            raise ValueError(f"tensor {name} written twice")
        dtype = DTYPES.get(rows.dtype)
        if dtype is None:
            raise ValueError(f"{name}: no safetensors type for {rows.dtype}")
        gap = -self._end % ALIGN
        if gap:
            self._entries[f"{PAD_PREFIX}{self._pads}"] = {
                "dtype": "U8", "shape": [gap], "data_offsets": [self._end, self._end + gap], "numpy": "uint8"
            }  # fmt: skip
            self._pads += 1
            self._end += gap
        row_bytes = int(np.prod(rows.shape[1:], dtype=np.int64)) * rows.dtype.itemsize
        size = row_bytes * total
        self._entries[name] = {
            "dtype": dtype,
            "shape": [total, *rows.shape[1:]],
            "data_offsets": [self._end, self._end + size],
            "numpy": rows.dtype.str,
        }
        self._row_bytes[name] = row_bytes
        self._end += size

    def close(self, metadata: dict[str, str]) -> None:
        """Write the header once every range is written: the file is complete."""
        self._stop_writer(drain=True)
        self._raise_failure()
        entries = {
            name: {key: value for key, value in entry.items() if key != "numpy"}
            for name, entry in self._entries.items()
        }
        header = json.dumps({"__metadata__": metadata, **entries}, separators=(",", ":")).encode()
        self._file.truncate(8 + self._room + self._end)  # the pads are holes: zeros
        if len(header) <= self._room:
            self._file.seek(0)
            self._file.write(struct.pack("<Q", self._room) + header + b" " * (self._room - len(header)))
            self._file.close()
            return
        self._file.close()
        self._move_data(header)

    def _move_data(self, header: bytes) -> None:
        """The header outgrew its room: write the file again with a larger one (one extra copy)."""
        room = -(-(len(header) + 8) // ALIGN) * ALIGN - 8
        moved = self.path.with_name(self.path.name + ".moving")
        with self.path.open("rb") as source, moved.open("wb") as target:
            target.write(struct.pack("<Q", room) + header + b" " * (room - len(header)))
            source.seek(8 + self._room)
            shutil.copyfileobj(source, target, 16 * 1024 * 1024)
        os.replace(moved, self.path)


def is_pad(name: str) -> bool:
    """Whether a tensor only fills the gap before the next one (see the module's note)."""
    return name.startswith(PAD_PREFIX)
