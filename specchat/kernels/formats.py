"""Block-quantized weights: read from GGUF blocks or quantized from floats, and packed for qgemm.cpp.

Six formats, named after the number of bits a weight takes in the kernel:

- ``q4``: 4-bit unsigned values in groups of 32 inputs, each group with a 6-bit scale and a 6-bit
  min against fp16 super-block factors: w = d·sc·q − dmin·mn. This is llama.cpp's Q4_K exactly,
  so a Q4_K tensor is repacked without changing a single weight.
- ``q5``: q4 with 5-bit values (0…31): llama.cpp's Q5_K exactly.
- ``q8``: 8-bit unsigned values in groups of 16 with a signed 8-bit scale against an fp16
  super-block factor: w = d·sc·(q − offset). Floats quantized here use offset 128.
- ``q6``: llama.cpp's Q6_K, the q8 arithmetic with offset 32 on values 0…63 stored in 6 bits
  (q8 would spend 8 bits on each, a quarter more bytes for a decoding step to stream).
- ``f16`` and ``f32``: float weights as they are (llama.cpp's F16; F32, and BF16 widened to F32
  exactly). These multiply the float input, not its int8 quantization.

llama.cpp's 32-weight block types fit these exactly too, with super-blocks of one block: Q8_0 is
q8 with unit group scales, Q4_0 and Q4_1 are q4 with unit scales and the block's min as the min
factor, Q5_1 is q5 the same way, Q5_0 is q6 with offset 16.

:class:`Unpacked` holds a matrix in either format as plain arrays (one value per weight), which
tests and the reference dequantizer read; :func:`pack` lays it out for the kernel, in the packed
layout that kernels/core/layout.h tables array by array.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

KIND_CODES = {"q4": 4, "q5": 5, "q6": 6, "q8": 8, "f16": 16, "f32": 32}
"""Each format's code in the kernels (its bits per weight): core/layout.h's ``enum class Kind``,
which qgemm.cpp also reports as ``KINDS`` (tests/kernels/test_formats.py holds them equal)."""
FLOAT_KINDS = {"f16": np.float16, "f32": np.float32}
"""The float kinds and the dtype each keeps its weights in."""
MIN_KINDS = ("q4", "q5")
"""The kinds with a min per group: w = d·sc·q − dmin·mn over groups of 32 (the other block kinds:
w = d·sc·(q − offset) over groups of 16)."""

QK_K = 256
"""Inputs per super-block in llama.cpp's K-quants."""
CHANNELS = 16
"""Output channels per kernel block: one 512-bit register holds one value of each."""


@dataclass(frozen=True)
class Unpacked:
    """A quantized [N, K] matrix, one array element per weight or per group."""

    kind: str
    """"q4", "q5", "q6", "q8", "f16" or "f32"."""
    q: np.ndarray
    """[N, K] uint8 values (the float kinds: the float16 or float32 weights)."""
    sc: np.ndarray
    """[N, K/G] group scales: uint8 (q4, q5) or int8 (q6, q8)."""
    d: np.ndarray
    """[N, K/S] float16 super-block scale factors."""
    super_block: int
    """S: inputs per super-block (a multiple of the group size that divides K)."""
    mn: np.ndarray | None = None
    """[N, K/32] uint8 group mins (q4, q5)."""
    dm: np.ndarray | None = None
    """[N, K/S] float16 super-block min factors (q4, q5)."""
    offset: int = 0
    """q6, q8: the value that stands for zero."""

    @property
    def has_mins(self) -> bool:
        return self.kind in MIN_KINDS

    @property
    def is_float(self) -> bool:
        return self.kind in FLOAT_KINDS

    @property
    def group(self) -> int:
        return 32 if self.has_mins else 16

    @property
    def shape(self) -> tuple[int, int]:
        return int(self.q.shape[0]), int(self.q.shape[1])

    def take_rows(self, order: np.ndarray) -> Unpacked:
        """The same matrix with its output channels (rows) reordered: row i becomes row order[i]."""

        def rows(a: np.ndarray | None) -> np.ndarray | None:
            return None if a is None else np.ascontiguousarray(a[order])

        return Unpacked(
            self.kind, rows(self.q), rows(self.sc), rows(self.d), self.super_block,  # type: ignore[arg-type]
            rows(self.mn), rows(self.dm), self.offset,
        )  # fmt: skip

    def dequantize(self) -> np.ndarray:
        """The float32 weights the kernel computes with (the reference for tests)."""
        if self.is_float:
            return self.q.astype(np.float32)
        n, k = self.shape
        per_super = self.super_block // self.group
        d = np.repeat(self.d.astype(np.float32), per_super, axis=1)
        scale = (d * self.sc.astype(np.float32)).reshape(n, k // self.group, 1)
        q = self.q.astype(np.float32).reshape(n, k // self.group, self.group)
        if not self.has_mins:
            return (scale * (q - self.offset)).reshape(n, k)
        assert self.mn is not None and self.dm is not None
        dm = np.repeat(self.dm.astype(np.float32), per_super, axis=1)
        minimum = (dm * self.mn.astype(np.float32)).reshape(n, k // self.group, 1)
        return (scale * q - minimum).reshape(n, k)


# ------------------------------------------------------------------------------ from GGUF blocks
def unpack_q4_k(raw: np.ndarray, n: int, k: int) -> Unpacked:
    """llama.cpp Q4_K blocks (144 bytes per 256 weights) of an [n, k] matrix."""
    blocks = np.ascontiguousarray(raw).view(np.uint8).reshape(n * k // QK_K, 144)
    d = blocks[:, 0:2].copy().view(np.float16).reshape(n, k // QK_K)
    dm = blocks[:, 2:4].copy().view(np.float16).reshape(n, k // QK_K)
    scales = blocks[:, 4:16].reshape(-1, 3, 4)
    lo, mid, hi = scales[:, 0], scales[:, 1], scales[:, 2]
    sc = np.concatenate([lo & 0x3F, (hi & 0x0F) | ((lo >> 2) & 0x30)], axis=-1)
    mn = np.concatenate([mid & 0x3F, (hi >> 4) | ((mid >> 2) & 0x30)], axis=-1)
    qs = blocks[:, 16:].reshape(-1, 4, 1, 32) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)
    q = (qs & 0x0F).reshape(n, k)
    return Unpacked("q4", q, sc.reshape(n, k // 32), d, QK_K, mn.reshape(n, k // 32), dm)


def unpack_q5_k(raw: np.ndarray, n: int, k: int) -> Unpacked:
    """llama.cpp Q5_K blocks (176 bytes per 256 weights): Q4_K's scales, mins and nibbles, and
    the fifth bit of weight 32g + l in bit g of byte l of the block's 32-byte ``qh``."""
    blocks = np.ascontiguousarray(raw).view(np.uint8).reshape(n * k // QK_K, 176)
    as_q4_k = np.concatenate([blocks[:, :16], blocks[:, 48:]], axis=1)  # without qh: a Q4_K block
    low = unpack_q4_k(as_q4_k, n, k)
    qh = blocks[:, 16:48].reshape(-1, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 8, 1)
    q = low.q | ((qh & 1) << 4).reshape(n, k)
    return replace(low, kind="q5", q=q)


def unpack_q6_k(raw: np.ndarray, n: int, k: int) -> Unpacked:
    """llama.cpp Q6_K blocks (210 bytes per 256 weights) of an [n, k] matrix."""
    blocks = np.ascontiguousarray(raw).view(np.uint8).reshape(n * k // QK_K, 210)
    shifted_low = blocks[:, :128].reshape(-1, 2, 1, 64) >> np.array([0, 4], dtype=np.uint8).reshape(
        1, 1, 2, 1
    )
    ql = (shifted_low & 0x0F).reshape(-1, 2, 4, 32)
    shifted_high = blocks[:, 128:192].reshape(-1, 2, 1, 32) >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(
        1, 1, 4, 1
    )
    qh = (shifted_high & 0x03).reshape(-1, 2, 4, 32)
    q = (ql | (qh << 4)).reshape(n, k).astype(np.uint8)
    sc = blocks[:, 192:208].copy().view(np.int8).reshape(n, k // 16)
    d = blocks[:, 208:210].copy().view(np.float16).reshape(n, k // QK_K)
    return Unpacked("q6", q, sc, d, QK_K, offset=32)


def unpack_q8_0(raw: np.ndarray, n: int, k: int) -> Unpacked:
    """llama.cpp Q8_0 blocks (34 bytes per 32 weights, w = d·q): q8 with unit group scales."""
    blocks = np.ascontiguousarray(raw).view(np.uint8).reshape(n * k // 32, 34)
    d = blocks[:, 0:2].copy().view(np.float16).reshape(n, k // 32)
    q = (blocks[:, 2:].copy().view(np.int8).astype(np.int16) + 128).astype(np.uint8).reshape(n, k)
    return Unpacked("q8", q, np.ones((n, k // 16), dtype=np.int8), d, 32, offset=128)


def unpack_q4_0(raw: np.ndarray, n: int, k: int) -> Unpacked:
    """llama.cpp Q4_0 blocks (18 bytes per 32 weights, w = d·(q − 8)): q4 with its min at 8·d."""
    blocks = np.ascontiguousarray(raw).view(np.uint8).reshape(n * k // 32, 18)
    d = blocks[:, 0:2].copy().view(np.float16).reshape(n, k // 32)
    q = _low_then_high_nibbles(blocks[:, 2:]).reshape(n, k)
    return _q4_with_unit_scales(q, d, d, mins=8)


def unpack_q4_1(raw: np.ndarray, n: int, k: int) -> Unpacked:
    """llama.cpp Q4_1 blocks (20 bytes per 32 weights, w = d·q + m): q4 with the min factor −m."""
    blocks = np.ascontiguousarray(raw).view(np.uint8).reshape(n * k // 32, 20)
    d = blocks[:, 0:2].copy().view(np.float16).reshape(n, k // 32)
    m = blocks[:, 2:4].copy().view(np.float16).reshape(n, k // 32)
    q = _low_then_high_nibbles(blocks[:, 4:]).reshape(n, k)
    return _q4_with_unit_scales(q, d, -m, mins=1)  # fp16 negation is exact


def unpack_q5_1(raw: np.ndarray, n: int, k: int) -> Unpacked:
    """llama.cpp Q5_1 blocks (24 bytes per 32 weights, w = d·q + m): q5 with the min factor −m."""
    blocks = np.ascontiguousarray(raw).view(np.uint8).reshape(n * k // 32, 24)
    d = blocks[:, 0:2].copy().view(np.float16).reshape(n, k // 32)
    m = blocks[:, 2:4].copy().view(np.float16).reshape(n, k // 32)
    high = np.unpackbits(blocks[:, 4:8], axis=-1, bitorder="little")  # [blocks, 32]: bit j of qh
    q = (_low_then_high_nibbles(blocks[:, 8:]) | (high << 4)).reshape(n, k)
    return replace(_q4_with_unit_scales(q, d, -m, mins=1), kind="q5")  # fp16 negation is exact


def unpack_q5_0(raw: np.ndarray, n: int, k: int) -> Unpacked:
    """llama.cpp Q5_0 blocks (22 bytes per 32 weights, w = d·(q − 16)): q6 with offset 16.

    The fifth bit of weight j is bit j of the block's little-endian 32-bit ``qh``.
    """
    blocks = np.ascontiguousarray(raw).view(np.uint8).reshape(n * k // 32, 22)
    d = blocks[:, 0:2].copy().view(np.float16).reshape(n, k // 32)
    high = np.unpackbits(blocks[:, 2:6], axis=-1, bitorder="little")  # [blocks, 32]: bit j of qh
    q = (_low_then_high_nibbles(blocks[:, 6:]) | (high << 4)).reshape(n, k)
    return Unpacked("q6", q, np.ones((n, k // 16), dtype=np.int8), d, 32, offset=16)


def unpack_f16(raw: np.ndarray, n: int, k: int) -> Unpacked:
    """An F16 tensor as the f16 kind: the same halves."""
    return _float_matrix("f16", np.asarray(raw, dtype=np.float16).reshape(n, k))


def unpack_f32(raw: np.ndarray, n: int, k: int) -> Unpacked:
    """An F32 tensor as the f32 kind."""
    return _float_matrix("f32", np.asarray(raw, dtype=np.float32).reshape(n, k))


def unpack_bf16(raw: np.ndarray, n: int, k: int) -> Unpacked:
    """A BF16 tensor as the f32 kind: a bfloat16 is a float32's top half, so widening is exact."""
    halves = np.ascontiguousarray(raw).view(np.uint16).reshape(n, k)
    return _float_matrix("f32", (halves.astype(np.uint32) << 16).view(np.float32))


def _float_matrix(kind: str, weights: np.ndarray) -> Unpacked:
    n, k = weights.shape
    if k % 16:
        raise ValueError(f"float weights need a multiple of 16 inputs, not {k}")
    empty = np.zeros((n, 0), dtype=np.int8)
    return Unpacked(kind, np.ascontiguousarray(weights), empty, np.zeros((n, 0), dtype=np.float16), k)


def _low_then_high_nibbles(qs: np.ndarray) -> np.ndarray:
    """[blocks, 16] bytes → [blocks, 32] values: weights 0…15 in the low nibbles, 16…31 in the high."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1).astype(np.uint8)


def _q4_with_unit_scales(q: np.ndarray, d: np.ndarray, dm: np.ndarray, mins: int) -> Unpacked:
    """A 32-weight-block type as q4 with super-blocks of one group: w = d·1·q − dm·mins."""
    n, k = q.shape
    ones = np.ones((n, k // 32), dtype=np.uint8)
    return Unpacked("q4", q, ones, d, 32, ones * np.uint8(mins), dm)


# ------------------------------------------------------------------------------ from floats
def super_block_for(k: int, group: int) -> int:
    """The largest super-block of at most 256 inputs that divides k (k must be a multiple of group)."""
    if k % group:
        raise ValueError(f"{k} inputs are not a multiple of the group size {group}")
    for size in range(min(QK_K, k), group - 1, -group):
        if k % size == 0:
            return size
    return group


def quantize_q4(weight: np.ndarray, super_block: int | None = None) -> Unpacked:
    """Asymmetric 4-bit groups of 32 with 6-bit scales and mins (Q4_K's shape).

    Scales and mins round up, so every weight of a group stays within its range and rounds to
    the nearest of its 16 levels (no clipping): the error is at most half the group's step.
    """
    w = np.asarray(weight, dtype=np.float32)
    n, k = w.shape
    s = super_block or super_block_for(k, 32)
    per_super = s // 32
    groups = w.reshape(n, k // 32, 32)
    low = np.minimum(groups.min(axis=-1), 0.0)
    dm = _factor(-low, per_super, 63)
    mn = np.clip(np.ceil(-low / _expand(dm, per_super)), 0, 63).astype(np.uint8)
    minimum = _expand(dm, per_super) * mn
    step = np.maximum(groups.max(axis=-1) + minimum, 1e-12) / 15.0
    d = _factor(step, per_super, 63)
    sc = np.clip(np.ceil(step / _expand(d, per_super)), 1, 63).astype(np.uint8)
    actual = (_expand(d, per_super) * sc)[..., None]
    q = np.clip(np.rint((groups + minimum[..., None]) / actual), 0, 15).astype(np.uint8)
    return Unpacked("q4", q.reshape(n, k), sc, d, s, mn, dm)


def quantize_q8(weight: np.ndarray, super_block: int | None = None) -> Unpacked:
    """Symmetric 8-bit groups of 16 with signed 8-bit scales (stored with offset 128).

    Scales round up, so no weight clips: the error is at most half the group's step.
    """
    w = np.asarray(weight, dtype=np.float32)
    n, k = w.shape
    s = super_block or super_block_for(k, 16)
    per_super = s // 16
    groups = w.reshape(n, k // 16, 16)
    step = np.maximum(np.abs(groups).max(axis=-1), 1e-12) / 127.0
    d = _factor(step, per_super, 127)
    sc = np.clip(np.ceil(step / _expand(d, per_super)), 1, 127).astype(np.int8)
    actual = (_expand(d, per_super) * sc)[..., None]
    q = np.clip(np.rint(groups / actual), -127, 127).astype(np.int16) + 128
    return Unpacked("q8", q.reshape(n, k).astype(np.uint8), sc, d, s, offset=128)


def _factor(values: np.ndarray, per_super: int, levels: int) -> np.ndarray:
    """The fp16 super-block factor that lets ``levels`` integer multiples reach each block's largest value.

    Rounded up after the fp16 cast, so ``levels`` multiples always suffice.
    """
    n = values.shape[0]
    peak = values.reshape(n, -1, per_super).max(axis=-1) / levels
    factor = peak.astype(np.float16)
    low = factor.astype(np.float32) < peak
    factor[low] = np.nextafter(factor[low], np.float16(np.inf))
    return np.maximum(factor, np.float16(6e-8))


def _expand(factor: np.ndarray, per_super: int) -> np.ndarray:
    return np.repeat(factor.astype(np.float32), per_super, axis=1)


# ------------------------------------------------------------------------------ kernel layout
# What pack writes, array by array: kernels/core/layout.h.
def _six_bit_planes(q: np.ndarray, blocks: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """q6 values (0…63) of [N16, K] as the kernel's two arrays, per group of 32 inputs.

    Quads a_j are inputs 4j…4j+3 of the group, b_j inputs 16+4j…: ``q`` byte 64j + 4c + t holds
    a_j's whole value in bits 0-5 and b_j's top two bits in bits 6-7; ``qh`` byte 64h + 4c + t
    holds the low four bits of b_2h (low nibble) and b_2h+1 (high nibble). One mask recovers a_j,
    a shift, a mask and a merge b_j: 18 instructions a group where keeping each value's low and
    top bits apart took 26, which is what keeps verify passes of 4–6 rows as fast as q8's.
    """
    # [N/16, 16 ch, K/32 groups, 2 halves, 4 quads, 4] -> [N/16, K/32, half, quad, 16, 4]
    quads = q.reshape(blocks, CHANNELS, k // 32, 2, 4, 4).transpose(0, 2, 3, 4, 1, 5)
    a, b = quads[:, :, 0], quads[:, :, 1]
    whole = (a & 0x3F) | ((b >> 4) << 6)
    nibbles = (b[:, :, 0::2] & 0x0F) | ((b[:, :, 1::2] & 0x0F) << 4)
    return (
        np.ascontiguousarray(whole).reshape(blocks, k // 32, 4, 64),
        np.ascontiguousarray(nibbles).reshape(blocks, k // 32, 2, 64),
    )


def packed_bytes(kind: str, n: int, k: int, super_block: int) -> int:
    """Bytes :func:`pack` lays out for an [n, k] matrix of ``kind`` (sizes a cache before packing)."""
    channels = -(-n // CHANNELS) * CHANNELS
    if kind in FLOAT_KINDS:
        return channels * k * np.dtype(FLOAT_KINDS[kind]).itemsize
    bits = KIND_CODES[kind]
    mins = kind in MIN_KINDS
    group = 32 if mins else 16
    per_group = 2 if mins else 1  # q4, q5: a scale and a min per group; q6, q8: a scale
    per_super = 2 if mins else 1  # fp16 factors: q4, q5 d and dmin; q6, q8 d
    return channels * (k * bits // 8 + k // group * per_group + k // super_block * 2 * per_super)


def pack(matrix: Unpacked) -> dict[str, np.ndarray]:
    """The arrays qgemm.cpp reads (kernels/core/layout.h), output channels padded to a multiple of 16."""
    n, k = matrix.shape
    blocks = -(-n // CHANNELS)
    if matrix.is_float:  # [N/16, 16, K]: a channel's weights in a row
        weights = np.zeros((blocks * CHANNELS, k), dtype=FLOAT_KINDS[matrix.kind])
        weights[:n] = matrix.q
        return {"q": weights.reshape(blocks, CHANNELS, k)}

    def by_channel_block(a: np.ndarray) -> np.ndarray:
        padded = np.zeros((blocks * CHANNELS, *a.shape[1:]), dtype=a.dtype)
        padded[:n] = a
        # [N, X] -> [N/16, X, 16]
        return np.ascontiguousarray(padded.reshape(blocks, CHANNELS, -1).transpose(0, 2, 1))

    q = np.zeros((blocks * CHANNELS, k), dtype=np.uint8)
    q[:n] = matrix.q
    out = {"sc": by_channel_block(matrix.sc), "d": by_channel_block(matrix.d)}
    if matrix.kind == "q6":
        out["q"], out["qh"] = _six_bit_planes(q, blocks, k)
        return out
    group = matrix.group
    # [N/16, 16 ch, K/G groups, G/4 quads, 4] -> [N/16, K/G, G/4, 16, 4]
    quads = q.reshape(blocks, CHANNELS, k // group, group // 4, 4).transpose(0, 2, 3, 1, 4)
    packed_q: np.ndarray
    if matrix.has_mins:  # quads j and j+4 share a byte (low and high nibble)
        low = quads & 0x0F
        packed_q = low[:, :, :4] | (low[:, :, 4:] << 4)
    else:
        packed_q = quads
    out["q"] = np.ascontiguousarray(packed_q).reshape(blocks, k // group, 4, 64)
    if matrix.kind == "q5":  # byte 4c + t: bit j is quad j's fifth bit
        fifth = (quads >> 4) << np.arange(8, dtype=np.uint8).reshape(1, 1, 8, 1, 1)
        out["qh"] = np.ascontiguousarray(np.bitwise_or.reduce(fifth, axis=2)).reshape(blocks, k // group, 64)
    if matrix.has_mins:
        assert matrix.mn is not None and matrix.dm is not None
        out["mn"] = by_channel_block(matrix.mn)
        out["dm"] = by_channel_block(matrix.dm)
    return out
