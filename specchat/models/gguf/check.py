"""The door between a GGUF file and the rest of specchat: its bytes walked and checked first, and
only the metadata specchat reads turned into Python values, lazily and within stated caps.

A GGUF file comes from strangers, so it is hostile input. The `gguf` package's reader trusts it:
it turns every element of every metadata array into its own numpy object (a 30 MB array of bytes
costs gigabytes), recurses into arrays nested in arrays (a RecursionError at 20,000 deep), and
converts counts that overflow. This walker steps over the metadata without building anything,
checks that every length, count and tensor lies inside the file, refuses what exceeds the caps
below, and keeps the position of every key: a value is decoded only when asked for, and only in
the namespaces specchat reads (``general.``, ``tokenizer.`` and the architecture's own). Keys
elsewhere are stepped over, whatever they hold. transformers, which builds the config and the
tokenizer, reads the file through :func:`specchat.models.gguf.lazy_reading.lazy_gguf_reading`,
which gives it the same view.

:func:`read_gguf` is the structural half of specchat's one validation layer; the other half,
:mod:`specchat.models.gguf.shape`, checks the metadata against the tensors' shapes and is the
only place a GGUF's numbers become decoder dimensions. Both raise :class:`ModelLoadError` with one
line naming the file, the key or tensor, and what is wrong; the CLI exits 2 on it.
"""

from __future__ import annotations

import mmap
import os
import stat
import struct
from dataclasses import dataclass, field
from math import prod
from pathlib import Path
from typing import Any

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from specchat.errors import ModelLoadError
from specchat.models.gguf.value_types import (
    ARRAY,
    NUMPY_TYPES,
    SCALAR_FORMATS,
    STRING,
    TYPE_NAMES,
    WIDTH,
)
from specchat.untrusted import clipped, visible

MAGIC = b"GGUF"
VERSIONS = (2, 3)

# The caps (docs/models.md, "What specchat reads of a GGUF file"). Real files stay far below them:
# a few hundred keys, a few thousand tensors, vocabularies of up to 262,144 tokens and about as
# many merges, chat templates of tens of KB, token strings of tens of bytes.
MAX_ENTRIES = 1 << 20
"""Metadata keys, and tensors, in one file."""
MAX_KEY_BYTES = 65_535
"""A key's length (the GGUF specification's own limit)."""
MAX_STRING_BYTES = 1 << 20
"""A string value specchat reads (the chat template is the longest): 1 MiB."""
MAX_ITEM_BYTES = 1 << 16
"""One string inside an array specchat reads (a vocabulary token): 64 KiB."""
MAX_VOCABULARY_ITEMS = 1 << 20
"""An array under ``tokenizer.`` (tokens, scores, token types, merges): 1,048,576 items."""
MAX_ARRAY_ITEMS = 1 << 16
"""Any other array specchat reads (per-layer values): 65,536 items."""
MAX_DIMS = 4
"""Dimensions of a tensor (ggml's own limit)."""

READ_NAMESPACES = ("general.", "tokenizer.")
"""Besides ``<architecture>.``, the key prefixes specchat (and transformers) read."""

_KNOWN_TENSOR_TYPES = {int(t) for t in GGML_QUANT_SIZES}
_PLAIN_TENSOR_TYPES = {
    GGMLQuantizationType.F16: np.float16, GGMLQuantizationType.F32: np.float32,
    GGMLQuantizationType.F64: np.float64, GGMLQuantizationType.I8: np.int8,
    GGMLQuantizationType.I16: np.int16, GGMLQuantizationType.I32: np.int32,
    GGMLQuantizationType.I64: np.int64,
}  # fmt: skip
"""Tensor types the `gguf` package exposes as typed arrays; the others as raw bytes, rows × bytes."""


class _Damaged(Exception):
    """Internal: the bytes do not follow the GGUF layout (the message says where)."""


class _Refused(Exception):
    """Internal: well-formed, but past a cap (the message says which)."""


@dataclass(frozen=True)
class Entry:
    """One metadata key, located: where its value lies and what it holds (nothing decoded)."""

    key: str
    offset: int
    """Where the key itself starts (the `gguf` package's field offset)."""
    kind: int
    start: int
    """Where the value starts."""
    end: int
    item_kind: int | None = None
    """For an array, its items' type."""
    count: int = 0
    """For an array, its length; for a string, its length in bytes."""
    longest: int = 0
    """The longest string in it, in bytes."""


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of the table, bounds-checked."""

    name: str
    ggml_type: GGMLQuantizationType
    dims: tuple[int, ...]
    """In the file's order: ``dims[0]`` is a row's width (a matrix's inputs), ``dims[1]`` its rows."""
    offset: int
    """Absolute, in the file."""
    nbytes: int

    @property
    def type_name(self) -> str:
        return self.ggml_type.name


@dataclass
class GgufFile:
    """A structurally sound GGUF file: its keys located, its tensors bounds-checked.

    Values are decoded on demand (:meth:`value`), tensors memory-mapped on demand
    (:meth:`tensor_data`); the file is never read whole.
    """

    path: Path
    size: int
    version: int
    alignment: int
    entries: dict[str, Entry]
    tensors: dict[str, TensorInfo]
    architecture: str | None
    _values: dict[str, Any] = field(default_factory=dict, repr=False)
    _map: np.memmap | None = field(default=None, repr=False)

    @property
    def name(self) -> str:
        """The file's name, safe to print."""
        return visible(clipped(self.path.name, 120))

    def reads(self, key: str) -> bool:
        """Whether ``key`` lies in a namespace specchat reads (the others are only stepped over)."""
        return reads_key(key, self.architecture)

    def has(self, key: str) -> bool:
        return key in self.entries

    def value(self, key: str, default: Any = None) -> Any:
        """The value of ``key`` (default if absent): an int, float, bool or str; a list for an array
        (of str, or of numbers), within the caps :func:`read_gguf` checked."""
        entry = self.entries.get(key)
        if entry is None:
            return default
        if key not in self._values:
            self._values[key] = _decode(self._bytes(), entry)
        return self._values[key]

    def array_length(self, key: str) -> int | None:
        entry = self.entries.get(key)
        return entry.count if entry is not None and entry.kind == ARRAY else None

    def tensor_data(self, name: str) -> np.ndarray:
        """The tensor's bytes, memory-mapped, shaped as the `gguf` package shapes them: typed
        [rows…, width] for float and integer types, raw bytes [rows…, bytes per row] for the others."""
        from gguf.quants import quant_shape_to_byte_shape

        info = self.tensors[name]
        raw = self._bytes()[info.offset : info.offset + info.nbytes]
        shape = tuple(reversed(info.dims))
        plain = _PLAIN_TENSOR_TYPES.get(info.ggml_type)
        if plain is not None:
            return raw.view(plain).reshape(shape)
        return raw.reshape(quant_shape_to_byte_shape(shape, info.ggml_type))

    def release(self, name: str) -> None:
        """Let the kernel drop the tensor's pages from this process's resident memory (they stay
        in the page cache): packing reads each tensor once, so without this the whole file would
        stay resident until the map closes, on top of the packed copy being written."""
        if self._map is None:
            return
        info = self.tensors[name]
        page = mmap.PAGESIZE
        start = -(-info.offset // page) * page  # whole pages inside the tensor only
        end = (info.offset + info.nbytes) // page * page
        if end > start and hasattr(mmap, "MADV_DONTNEED"):
            self._map._mmap.madvise(mmap.MADV_DONTNEED, start, end - start)  # type: ignore[attr-defined]

    def _bytes(self) -> np.memmap:
        if self._map is None:
            self._map = np.memmap(self.path, mode="r")
        return self._map


def reads_key(key: str, architecture: str | None) -> bool:
    if key.startswith(READ_NAMESPACES):
        return True
    return architecture is not None and key.startswith(f"{architecture}.")


def read_gguf(path: Path) -> GgufFile:
    """The GGUF file at ``path``, walked and checked; ModelLoadError (one line) unless it is a
    complete GGUF within the caps. Only a regular file is opened (a FIFO would block, a device
    never ends)."""
    shown = visible(str(path))
    size = _regular_file_size(path)
    if size < 4:
        raise ModelLoadError(f"{shown} is not a GGUF file (it does not start with the GGUF magic bytes)")
    with path.open("rb") as handle:
        if handle.read(4) != MAGIC:
            raise ModelLoadError(f"{shown} is not a GGUF file (it does not start with the GGUF magic bytes)")
        if size < 24:
            raise ModelLoadError(f"{shown} is truncated ({size} bytes); download or copy it again")
        import mmap

        with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as blob, memoryview(blob) as view:
            try:
                return _walk_file(path, view)
            except _Refused as err:
                raise ModelLoadError(
                    f"{shown}: {err}; specchat refuses it (the limits: docs/models.md)"
                ) from None
            except _Truncated as err:
                raise ModelLoadError(
                    f"{shown} is truncated ({size} bytes, {err}); download or copy it again"
                ) from None
            except (_Damaged, struct.error, ValueError, KeyError, OverflowError, RecursionError) as err:
                reason = visible(clipped(str(err) or type(err).__name__, 200))
                raise ModelLoadError(
                    f"{shown} is a damaged GGUF file ({reason}); download or copy it again"
                ) from None


def check_gguf(path: Path) -> None:
    """ModelLoadError naming ``path`` unless it is a structurally complete GGUF file (see read_gguf)."""
    read_gguf(path)


class _Truncated(Exception):
    """Internal: the tensors need more bytes than the file has."""


def _regular_file_size(path: Path) -> int:
    """The size of the regular file at ``path``; ModelLoadError for anything else. Opened without
    blocking, so a FIFO with no writer is refused instead of waited on."""
    shown = visible(str(path))
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as err:
        raise ModelLoadError(f"cannot read {shown}: {err.strerror or err}") from None
    try:
        info = os.fstat(fd)
    finally:
        os.close(fd)
    if stat.S_ISREG(info.st_mode):
        return info.st_size
    kind = (
        "a folder" if stat.S_ISDIR(info.st_mode)
        else "a pipe (FIFO)" if stat.S_ISFIFO(info.st_mode)
        else "a device" if stat.S_ISCHR(info.st_mode) or stat.S_ISBLK(info.st_mode)
        else "a socket" if stat.S_ISSOCK(info.st_mode)
        else "not a regular file"
    )  # fmt: skip
    raise ModelLoadError(f"cannot read {shown}: it is {kind}; a GGUF model must be a regular file on disk")


def _walk_file(path: Path, view: memoryview) -> GgufFile:
    walk = MetadataWalk(view)
    version, tensor_count, kv_count = walk.unpack("<IQQ", 4)
    if version not in VERSIONS:
        raise _Damaged(f"unsupported GGUF version {version}")
    if tensor_count == 0 or tensor_count > MAX_ENTRIES or kv_count > MAX_ENTRIES:
        raise _Damaged(f"implausible header: {tensor_count} tensors, {kv_count} metadata keys")
    entries, pos = walk.metadata(24, kv_count)
    architecture = architecture_of(view, entries)
    for entry in entries.values():
        if reads_key(entry.key, architecture):
            _check_read_entry(entry)
    alignment = _alignment(view, entries)
    pos, tensors = walk.tensor_table(pos, tensor_count)
    data_start = (pos + alignment - 1) // alignment * alignment
    found = GgufFile(path, len(view), version, alignment, entries, {}, architecture)
    end = data_start
    for info in tensors:
        placed = TensorInfo(info.name, info.ggml_type, info.dims, data_start + info.offset, info.nbytes)
        found.tensors[info.name] = placed
        end = max(end, placed.offset + placed.nbytes)
    if end > len(view):
        raise _Truncated(f"its tensors need {end}")
    return found


def architecture_of(view: memoryview, entries: dict[str, Entry]) -> str | None:
    entry = entries.get("general.architecture")
    if entry is None or entry.kind != STRING:
        return None
    if entry.count > 256:
        raise _Refused(f"general.architecture is {entry.count:,} bytes long")
    return _decode(view, entry)  # type: ignore[no-any-return]


def _alignment(view: memoryview, entries: dict[str, Entry]) -> int:
    entry = entries.get("general.alignment")
    if entry is None:
        return 32  # the GGUF default
    if entry.kind != 4:
        raise _Damaged(f"general.alignment is a {TYPE_NAMES.get(entry.kind, entry.kind)}, not a uint32")
    (alignment,) = struct.unpack_from("<I", view, entry.start)
    if alignment <= 0 or alignment & (alignment - 1):
        raise _Damaged(f"alignment {alignment} is not a power of two")
    return int(alignment)


def _check_read_entry(entry: Entry) -> None:
    """The caps on a key specchat reads (and hands to transformers)."""
    key = visible(clipped(entry.key, 80))
    if entry.kind == STRING and entry.count > MAX_STRING_BYTES:
        raise _Refused(
            f"metadata {key} is a string of {entry.count:,} bytes (at most {MAX_STRING_BYTES:,} are read)"
        )
    if entry.kind != ARRAY:
        return
    if entry.item_kind == ARRAY:
        raise _Refused(f"metadata {key} holds arrays inside an array, which no model file specchat reads has")
    limit = MAX_VOCABULARY_ITEMS if entry.key.startswith("tokenizer.") else MAX_ARRAY_ITEMS
    if entry.count > limit:
        raise _Refused(f"metadata {key} is an array of {entry.count:,} items (at most {limit:,} are read)")
    if entry.longest > MAX_ITEM_BYTES:
        raise _Refused(
            f"metadata {key} holds a string of {entry.longest:,} bytes (at most {MAX_ITEM_BYTES:,} per item)"
        )


class MetadataWalk:
    """Steps over the GGUF layout in a memoryview, checking every offset against its length."""

    def __init__(self, view: memoryview) -> None:
        self.view = view
        self.size = len(view)

    def unpack(self, fmt: str, pos: int) -> tuple[Any, ...]:
        if pos + struct.calcsize(fmt) > self.size:
            raise _Damaged("the header runs past the end of the file")
        return struct.unpack_from(fmt, self.view, pos)

    def string_end(self, pos: int, limit: int | None = None) -> int:
        (length,) = self.unpack("<Q", pos)
        if limit is not None and length > limit:
            raise _Damaged(f"a name of {length:,} bytes")
        end = pos + 8 + length
        if end > self.size:
            raise _Damaged("a string runs past the end of the file")
        return end

    def text(self, pos: int, limit: int) -> tuple[str, int]:
        end = self.string_end(pos, limit)
        try:
            return self.view[pos + 8 : end].tobytes().decode("utf-8"), end
        except UnicodeDecodeError:
            raise _Damaged(f"a name at byte {pos} is not UTF-8") from None

    def metadata(self, pos: int, count: int) -> tuple[dict[str, Entry], int]:
        entries: dict[str, Entry] = {}
        for _ in range(count):
            offset = pos
            key, pos = self.text(pos, MAX_KEY_BYTES)
            if key in entries:
                raise _Damaged(f"the metadata key {visible(clipped(key, 80))} appears twice")
            (kind,) = self.unpack("<I", pos)
            start = pos + 4
            end, longest = self.value_end(start, kind)
            item_kind, length = None, 0
            if kind == ARRAY:
                item_kind, length = self.unpack("<IQ", start)
            elif kind == STRING:
                (length,) = self.unpack("<Q", start)
            entries[key] = Entry(key, offset, kind, start, end, item_kind, length, longest)
            pos = end
        return entries, pos

    def value_end(self, pos: int, kind: int) -> tuple[int, int]:
        """(where a value of type ``kind`` at ``pos`` ends, the longest string in it). Arrays nested
        in arrays are stepped over with an explicit stack, never by recursion, and every count is
        checked against the bytes left, so no count can make this loop longer than the file."""
        longest = 0
        pending = [(kind, 1)]  # (type, how many consecutive values of it are still to step over)
        while pending:
            value_kind, left = pending.pop()
            if left == 0:
                continue
            if value_kind in WIDTH:
                pos += WIDTH[value_kind] * left
                if pos > self.size:
                    raise _Damaged("an array runs past the end of the file")
            elif value_kind == STRING:
                for _ in range(left):
                    if pos + 8 > self.size:
                        raise _Damaged("a string runs past the end of the file")
                    (length,) = struct.unpack_from("<Q", self.view, pos)
                    pos += 8 + length
                    if pos > self.size:
                        raise _Damaged("a string runs past the end of the file")
                    longest = max(longest, length)
            elif value_kind == ARRAY:
                pending.append((ARRAY, left - 1))
                item_kind, count = self.unpack("<IQ", pos)
                pos += 12
                if item_kind not in WIDTH and item_kind not in (STRING, ARRAY):
                    raise _Damaged(f"unknown metadata type {item_kind}")
                if count > (self.size - pos) // WIDTH.get(item_kind, 8) + 1:
                    raise _Damaged(f"an array of {count:,} items in a {self.size:,}-byte file")
                if len(pending) > self.size // 12:
                    raise _Damaged("arrays nest deeper than the file is long")
                pending.append((item_kind, count))
            else:
                raise _Damaged(f"unknown metadata type {value_kind}")
        return pos, longest

    def tensor_table(self, pos: int, count: int) -> tuple[int, list[TensorInfo]]:
        """(end of the table, every tensor with its offset relative to the data section)."""
        tensors: list[TensorInfo] = []
        names: set[str] = set()
        for _ in range(count):
            name, pos = self.text(pos, MAX_KEY_BYTES)
            if name in names:
                raise _Damaged(f"the tensor {visible(clipped(name, 80))} appears twice")
            names.add(name)
            (ndims,) = self.unpack("<I", pos)
            if not 1 <= ndims <= MAX_DIMS:
                raise _Damaged(f"a tensor with {ndims} dimensions")
            dims = self.unpack(f"<{ndims}Q", pos + 4)
            pos += 4 + 8 * ndims
            kind, offset = self.unpack("<IQ", pos)
            pos += 12
            if kind not in _KNOWN_TENSOR_TYPES:
                raise _Damaged(f"tensor type {kind}, unknown to this gguf package")
            ggml_type = GGMLQuantizationType(kind)
            block, block_bytes = GGML_QUANT_SIZES[ggml_type]
            shown = visible(clipped(name, 80))
            if min(dims) < 1 or prod(dims) > self.size * 8:
                raise _Damaged(f"tensor {shown} claims dimensions {list(dims)}")
            if dims[0] % block:
                raise _Damaged(
                    f"tensor {shown} has rows of {dims[0]}, not whole {ggml_type.name} blocks of {block}"
                )
            tensors.append(
                TensorInfo(
                    name, ggml_type, tuple(int(d) for d in dims), offset, prod(dims) // block * block_bytes
                )
            )
        return pos, tensors


def _decode(view: Any, entry: Entry) -> Any:
    """The value of a located key (its caps were checked when it was walked)."""
    buffer = memoryview(view) if not isinstance(view, memoryview) else view
    if entry.kind == STRING:
        return _utf8(buffer[entry.start + 8 : entry.end], entry.key)
    if entry.kind in SCALAR_FORMATS:
        return struct.unpack_from(SCALAR_FORMATS[entry.kind], buffer, entry.start)[0]
    assert entry.item_kind is not None
    items = entry.start + 12
    if entry.item_kind in NUMPY_TYPES:
        count = entry.count
        array = np.frombuffer(buffer, dtype=NUMPY_TYPES[entry.item_kind], count=count, offset=items)
        return array.tolist()
    if entry.item_kind == STRING:
        strings = []
        pos = items
        for _ in range(entry.count):
            (length,) = struct.unpack_from("<Q", buffer, pos)
            strings.append(_utf8(buffer[pos + 8 : pos + 8 + length], entry.key))
            pos += 8 + length
        return strings
    raise ModelLoadError(f"metadata {visible(clipped(entry.key, 80))} holds arrays inside an array")


def _utf8(raw: memoryview, key: str) -> str:
    try:
        return raw.tobytes().decode("utf-8")
    except UnicodeDecodeError:
        raise ModelLoadError(f"metadata {visible(clipped(key, 80))} is not UTF-8 text") from None
