"""transformers reading a GGUF's metadata the way specchat does: lazily, within the caps.

transformers builds the config and the tokenizer from a GGUF through two readers (its own and the
`gguf` package's); both would turn every metadata value into Python objects. While
:func:`lazy_gguf_reading` is active they read through :class:`~specchat.models.gguf.check.MetadataWalk`
instead, so only the keys specchat reads are decoded (see :mod:`specchat.models.gguf.check`).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
from gguf import GGUFReader, ReaderField

from specchat.models.gguf.check import MAGIC, MetadataWalk, architecture_of, reads_key

_reading = threading.RLock()


class LazyGGUFReader(GGUFReader):
    """The `gguf` package's reader, building fields for the keys specchat reads only: a key
    elsewhere, however large or deeply nested, is stepped over by :class:`MetadataWalk`."""

    @property  # type: ignore[override]
    def data(self) -> np.ndarray:
        return self._plain_data

    @data.setter
    def data(self, value: np.ndarray) -> None:
        # The reader slices its map once per value (millions of times for a vocabulary); a slice
        # of np.memmap costs about ten times one of a plain array over the same mapped bytes,
        # which made reading a Qwen tokenizer take 20 s.
        self._plain_data = value.view(np.ndarray)

    def _build_fields(self, offs: int, count: int) -> int:
        with memoryview(self.data.data) as view:
            entries, end = MetadataWalk(view).metadata(int(offs), int(count))
            architecture = architecture_of(view, entries)
        for entry in entries.values():
            if not reads_key(entry.key, architecture):
                continue
            kv_klen, kv_kdata = self._get_str(entry.offset)
            parts: list[np.ndarray] = [kv_klen, kv_kdata, self._get(entry.start - 4, np.uint32)]
            _size, field_parts, field_idxs, field_types = self._get_field_parts(entry.start, entry.kind)
            field = ReaderField(
                entry.offset,
                entry.key,
                parts + field_parts,
                [idx + len(parts) for idx in field_idxs],
                field_types,
            )
            self._push_field(field, skip_sum=True)
        return end


@contextlib.contextmanager
def lazy_gguf_reading() -> Iterator[None]:
    """While inside, transformers reads a GGUF's metadata as specchat does: only the keys in the
    namespaces specchat reads, every other key stepped over unread. transformers has two readers,
    both swapped here: its own (``integrations.gguf.reader``, config and tokenizer) and the
    `gguf` package's (:class:`LazyGGUFReader`, its older loading path). Call :func:`read_gguf`
    first, so that the keys they do read are within the caps. The swaps are process-wide, hence
    the lock; they give transformers every key it reads exactly as the originals do. Should a
    later transformers rename what is swapped, that reader is left as it is (the caps still
    hold for the keys specchat reads)."""
    import gguf

    swaps: list[tuple[Any, str, Any]] = [(gguf, "GGUFReader", LazyGGUFReader)]
    hf_reader = _transformers_reader()
    if hf_reader is not None and hasattr(hf_reader, "_read_metadata") and hasattr(hf_reader, "_read_value"):
        swaps.append((hf_reader, "_read_metadata", _lazy_metadata_reader(hf_reader._read_value)))
    with _reading:
        originals = [(owner, name, getattr(owner, name)) for owner, name, _ in swaps]
        for owner, name, replacement in swaps:
            setattr(owner, name, replacement)
        try:
            yield
        finally:
            for owner, name, original in originals:
                setattr(owner, name, original)


def _transformers_reader() -> Any:
    """transformers' own GGUF reader module (None in a transformers without one)."""
    try:
        from transformers.integrations.gguf import reader
    except ImportError:
        return None
    return reader


def _lazy_metadata_reader(read_value: Any) -> Any:
    """transformers' ``_read_metadata`` (metadata, tensor count, end of the metadata), reading the
    values specchat reads with transformers' own ``read_value`` and stepping over the rest."""

    def read_metadata(
        blob: np.ndarray, gguf_path: str, string_arrays: Any = ()
    ) -> tuple[dict[str, Any], int, int]:
        with memoryview(blob.data) as view:
            walk = MetadataWalk(view)
            if view[:4].tobytes() != MAGIC:
                raise ValueError(f"{gguf_path} does not start with the GGUF magic bytes")
            _version, tensor_count, kv_count = walk.unpack("<IQQ", 4)
            entries, end = walk.metadata(24, kv_count)
            architecture = architecture_of(view, entries)
        metadata: dict[str, Any] = {}
        for key, entry in entries.items():
            if reads_key(key, architecture):
                metadata[key], _ = read_value(blob, entry.start, entry.kind, key in string_arrays)
        if "general.architecture" not in metadata:
            raise ValueError(f"{gguf_path} has no general.architecture in its metadata")
        return metadata, tensor_count, end

    return read_metadata
