"""A quick structural check of a GGUF file, so a corrupt download fails with one clear line.

The `gguf` package's reader decodes every vocabulary string into numpy objects (about 9 s for a
150k-token Qwen file on a small CPU), and transformers parses the file again anyway. This walker
only steps over the metadata to reach the tensor table, then checks that every tensor's bytes lie
inside the file: that catches bad magic, truncation and garbage in well under a second.
"""

from __future__ import annotations

import mmap
import struct
from math import prod
from pathlib import Path

from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from specchat.errors import ModelLoadError

MAGIC = b"GGUF"
VERSIONS = (2, 3)
# Sanity limits: real files have hundreds of keys and a few thousand tensors at most. Garbage that
# starts with the magic would otherwise make us loop over billions of "entries".
MAX_ENTRIES = 1 << 20
# Metadata value types (GGUF spec): fixed-size scalars by their width; 8 is string, 9 is array.
_WIDTH = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY = 8, 9
_KNOWN_TYPES = {int(t) for t in GGML_QUANT_SIZES}


class _Damaged(Exception):
    """Internal: the bytes do not follow the GGUF layout."""


def check_gguf(path: Path) -> None:
    """ModelLoadError naming `path` unless it is a structurally complete GGUF file."""
    size = path.stat().st_size
    with path.open("rb") as handle:
        if handle.read(4) != MAGIC:
            raise ModelLoadError(f"{path} is not a GGUF file (it does not start with the GGUF magic bytes)")
        if size < 24:
            raise ModelLoadError(f"{path} is truncated ({size} bytes); download or copy it again")
        with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as blob:
            try:
                end = _data_end(blob)
            except (_Damaged, struct.error, ValueError, KeyError, UnicodeDecodeError) as err:
                raise ModelLoadError(
                    f"{path} is a damaged GGUF file ({err or 'bad layout'}); download or copy it again"
                ) from err
    if end > size:
        raise ModelLoadError(
            f"{path} is truncated ({size} bytes, its tensors need {end}); download or copy it again"
        )


def _data_end(blob: mmap.mmap) -> int:
    """Offset just past the last tensor's bytes."""
    version, tensor_count, kv_count = struct.unpack_from("<IQQ", blob, 4)
    if version not in VERSIONS:
        raise _Damaged(f"unsupported GGUF version {version}")
    if tensor_count == 0 or tensor_count > MAX_ENTRIES or kv_count > MAX_ENTRIES:
        raise _Damaged(f"implausible header: {tensor_count} tensors, {kv_count} metadata keys")
    pos, alignment = _skip_metadata(blob, 24, kv_count)
    pos, tensors = _tensor_table(blob, pos, tensor_count)
    data_start = (pos + alignment - 1) // alignment * alignment
    return max(data_start + offset + nbytes for offset, nbytes in tensors)


def _skip_metadata(blob: mmap.mmap, pos: int, count: int) -> tuple[int, int]:
    """Walk the key/value section; returns its end and the file's data alignment."""
    alignment = 32  # the GGUF default
    for _ in range(count):
        key, pos = _string(blob, pos)
        (kind,) = struct.unpack_from("<I", blob, pos)
        if key == "general.alignment" and kind == 4:
            (alignment,) = struct.unpack_from("<I", blob, pos + 4)
        pos = _skip_value(blob, pos + 4, kind)
    if alignment <= 0 or alignment & (alignment - 1):
        raise _Damaged(f"alignment {alignment} is not a power of two")
    return pos, alignment


def _skip_value(blob: mmap.mmap, pos: int, kind: int) -> int:
    if kind in _WIDTH:
        return pos + _WIDTH[kind]
    if kind == _STRING:
        return _string_end(blob, pos)
    if kind != _ARRAY:
        raise _Damaged(f"unknown metadata type {kind}")
    item_kind, count = struct.unpack_from("<IQ", blob, pos)
    pos += 12
    if item_kind in _WIDTH:
        return pos + count * _WIDTH[item_kind]
    if count > len(blob):
        raise _Damaged(f"array of {count} items in a {len(blob)}-byte file")
    for _ in range(count):  # strings (a vocabulary) or nested arrays: each has its own length
        pos = _skip_value(blob, pos, item_kind)
    return pos


def _tensor_table(blob: mmap.mmap, pos: int, count: int) -> tuple[int, list[tuple[int, int]]]:
    """(end of the table, [(offset in the data section, byte size)] for every tensor)."""
    tensors = []
    for _ in range(count):
        pos = _string_end(blob, pos)
        (ndims,) = struct.unpack_from("<I", blob, pos)
        if ndims > 8:
            raise _Damaged(f"a tensor with {ndims} dimensions")
        dims = struct.unpack_from(f"<{ndims}Q", blob, pos + 4)
        pos += 4 + 8 * ndims
        kind, offset = struct.unpack_from("<IQ", blob, pos)
        pos += 12
        if kind not in _KNOWN_TYPES:
            raise _Damaged(f"tensor type {kind}, unknown to this gguf package")
        block, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType(kind)]
        tensors.append((offset, prod(dims) // block * block_bytes))
    return pos, tensors


def _string_end(blob: mmap.mmap, pos: int) -> int:
    (length,) = struct.unpack_from("<Q", blob, pos)
    end = pos + 8 + length
    if end > len(blob):
        raise _Damaged("a string runs past the end of the file")
    return end


def _string(blob: mmap.mmap, pos: int) -> tuple[str, int]:
    end = _string_end(blob, pos)
    return blob[pos + 8 : end].decode("utf-8"), end
