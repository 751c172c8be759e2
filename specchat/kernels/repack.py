"""GGUF blocks laid out for the kernels by native code (core/repack.h) on every core: the same
bytes as :func:`specchat.kernels.formats.pack` of the ``unpack_*`` functions, which remain the
reference (and the path for tensors this does not take: any requantized type, rows taken out of
order through :meth:`~specchat.kernels.formats.Unpacked.take_rows` of a fused matrix).

This is one pass over the bytes, where numpy's reference is far slower (the rates of both:
docs/lab/2026-12-05-big-targets.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from specchat.kernels import load

SUPER_BLOCKS = {"Q4_K": 256, "Q5_K": 256, "Q6_K": 256}
"""Inputs per packed super-block: a K-quant's 256; a 32-weight block type's 32; a float's K."""
OFFSETS = {"Q6_K": 32, "Q8_0": 128, "Q5_0": 16}
KINDS = {
    "Q4_K": "q4", "Q5_K": "q5", "Q6_K": "q6", "Q8_0": "q8", "Q4_0": "q4", "Q4_1": "q4",
    "Q5_0": "q6", "Q5_1": "q5", "F16": "f16", "BF16": "f32", "F32": "f32",
}  # fmt: skip
"""The kernels' kind of each GGUF type core/repack.h lays out."""
NATIVE_TYPES = frozenset(KINDS)
"""Every type formats.py keeps as it is."""


@dataclass(frozen=True)
class Packed:
    """A matrix's rows already in the kernels' layout: :func:`formats.pack`'s arrays, in its order."""

    kind: str
    super_block: int
    offset: int
    rows: int
    arrays: dict[str, np.ndarray]


def repack(raw: np.ndarray, type_name: str, n: int, k: int, order: np.ndarray | None = None) -> Packed:
    """Rows ``0…n`` of the [?, k] GGUF tensor of ``type_name`` whose bytes are ``raw`` (a view of
    the memory-mapped file: nothing is copied before the layout), or with ``order`` its rows
    ``order[i]`` in turn (a reordering or a range of them). Raises ValueError for a type not in
    :data:`NATIVE_TYPES` or a size that does not fit."""
    if type_name not in NATIVE_TYPES:
        raise ValueError(f"no native repacking for GGUF type {type_name}")
    rows = None if order is None else torch.from_numpy(np.ascontiguousarray(order, dtype=np.int64))
    source = np.ascontiguousarray(raw).reshape(-1).view(np.uint8)
    try:
        arrays = load().repack_gguf(source, type_name, n, k, rows)
    except RuntimeError as err:  # torch's checks: a size that does not fit
        raise ValueError(str(err).splitlines()[0]) from err
    return Packed(
        KINDS[type_name],
        SUPER_BLOCKS.get(type_name, k if type_name in ("F16", "BF16", "F32") else 32),
        OFFSETS.get(type_name, 0),
        n,
        {name: tensor.numpy() for name, tensor in arrays},
    )
