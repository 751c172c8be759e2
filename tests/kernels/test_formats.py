"""GGUF blocks are repacked without changing a weight; floats quantize within their step."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import gguf
import numpy as np
import pytest

import specchat.kernels
from specchat.kernels.formats import (
    KIND_CODES,
    Unpacked,
    pack,
    packed_bytes,
    quantize_q4,
    quantize_q8,
    super_block_for,
    unpack_bf16,
    unpack_f16,
    unpack_f32,
    unpack_q4_0,
    unpack_q4_1,
    unpack_q4_k,
    unpack_q5_0,
    unpack_q5_1,
    unpack_q5_k,
    unpack_q6_k,
    unpack_q8_0,
)

Unpacker = Callable[[np.ndarray, int, int], Unpacked]

SMALL_BLOCK_TYPES: list[tuple[gguf.GGMLQuantizationType, Unpacker, str]] = [
    (gguf.GGMLQuantizationType.Q8_0, unpack_q8_0, "q8"),
    (gguf.GGMLQuantizationType.Q4_0, unpack_q4_0, "q4"),
    (gguf.GGMLQuantizationType.Q4_1, unpack_q4_1, "q4"),
    (gguf.GGMLQuantizationType.Q5_0, unpack_q5_0, "q6"),
    (gguf.GGMLQuantizationType.Q5_1, unpack_q5_1, "q5"),
]
"""The 32-weight block types kept at their own bits, with their unpackers and kernel formats."""


def small_blocks(qtype: gguf.GGMLQuantizationType, n: int, k: int, seed: int = 0) -> np.ndarray:
    """Valid blocks of a 32-weight type, quantized by gguf-py from rows of very different scales."""
    rng = np.random.default_rng(seed)
    weights = rng.standard_normal((n, k)) * rng.uniform(1e-3, 3.0, (n, 1)) + rng.uniform(-0.5, 0.5, (n, 1))
    return np.asarray(gguf.quants.quantize(weights.astype(np.float32), qtype))


def random_blocks(qtype: gguf.GGMLQuantizationType, n: int, k: int, seed: int = 0) -> np.ndarray:
    """Valid llama.cpp blocks: random bytes, with sane fp16 super-block factors."""
    rng = np.random.default_rng(seed)
    types = gguf.GGMLQuantizationType
    size = {types.Q4_K: 144, types.Q5_K: 176, types.Q6_K: 210}[qtype]
    blocks = rng.integers(0, 256, size=(n * k // 256, size), dtype=np.uint8)
    factors = rng.uniform(1e-3, 1e-2, size=(blocks.shape[0], 2)).astype(np.float16).view(np.uint8)
    if qtype != gguf.GGMLQuantizationType.Q6_K:
        blocks[:, 0:4] = factors  # d and dmin lead the block
    else:
        blocks[:, 208:210] = factors[:, :2]  # d ends it
    return blocks.reshape(n, -1)


@pytest.mark.parametrize(
    ("qtype", "unpack"),
    [
        (gguf.GGMLQuantizationType.Q4_K, unpack_q4_k),
        (gguf.GGMLQuantizationType.Q5_K, unpack_q5_k),
        (gguf.GGMLQuantizationType.Q6_K, unpack_q6_k),
    ],
)
def test_gguf_blocks_unpack_to_the_same_weights(qtype: gguf.GGMLQuantizationType, unpack: Unpacker) -> None:
    n, k = 48, 512
    raw = random_blocks(qtype, n, k)
    expected = gguf.quants.dequantize(raw, qtype).reshape(n, k)
    ours = unpack(raw, n, k).dequantize()
    assert np.array_equal(ours, expected)


@pytest.mark.parametrize(("qtype", "unpack", "kind"), SMALL_BLOCK_TYPES)
def test_small_block_types_unpack_to_the_same_weights(
    qtype: gguf.GGMLQuantizationType, unpack: Unpacker, kind: str
) -> None:
    n, k = 48, 512
    raw = small_blocks(qtype, n, k)
    matrix = unpack(raw, n, k)
    assert matrix.kind == kind and matrix.super_block == 32
    assert np.array_equal(matrix.dequantize(), gguf.quants.dequantize(raw, qtype).reshape(n, k))
    assert int(matrix.q.max()) < {"q4": 16, "q5": 32, "q6": 64, "q8": 256}[kind]  # fits the kernel's bits


@pytest.mark.parametrize("quantize", [quantize_q4, quantize_q8])
@pytest.mark.parametrize("k", [64, 896, 1536])
def test_float_quantization_stays_within_one_step(quantize: object, k: int) -> None:
    w = np.random.default_rng(1).standard_normal((20, k)).astype(np.float32)
    matrix = quantize(w)  # type: ignore[operator]
    groups = w.reshape(20, k // matrix.group, matrix.group)
    error = np.abs(matrix.dequantize() - w).reshape(groups.shape).max(axis=-1)
    # Half the step the group really uses; that step is the ideal one plus at most one scale unit.
    d = np.repeat(matrix.d.astype(np.float32), matrix.super_block // matrix.group, axis=1)
    step = d * np.abs(matrix.sc.astype(np.float32))
    assert np.all(error <= step / 2 * (1 + 1e-5))
    if matrix.kind == "q4":  # the min rounds up by at most one unit of its own factor too
        dm = np.repeat(matrix.dm.astype(np.float32), matrix.super_block // matrix.group, axis=1)
        ideal = (np.ptp(groups, axis=-1) + dm) / 15.0
    else:
        ideal = np.abs(groups).max(axis=-1) / 127.0
    assert np.all(step <= (ideal + d) * 1.001)


def test_super_blocks_divide_the_width() -> None:
    assert super_block_for(1536, 32) == 256
    assert super_block_for(896, 32) == 224
    assert super_block_for(64, 16) == 64
    with pytest.raises(ValueError):
        super_block_for(100, 32)


def test_packing_pads_channels_and_interleaves_groups() -> None:
    matrix = quantize_q4(np.random.default_rng(2).standard_normal((20, 64)).astype(np.float32))
    arrays = pack(matrix)
    assert arrays["q"].shape == (2, 2, 4, 64)  # 20 channels -> 2 blocks of 16; 64 inputs -> 2 groups
    # Channel 3, input 4*j + t of group 0 sits in byte 64*(j%4) + 4*3 + t, low nibble for j < 4.
    q = arrays["q"]
    for j in range(8):
        for t in range(4):
            byte = q[0, 0, j % 4, 4 * 3 + t]
            value = byte & 0x0F if j < 4 else byte >> 4
            assert value == matrix.q[3, 4 * j + t]


def test_six_bit_values_pack_into_whole_and_nibble_planes() -> None:
    n, k = 20, 512
    matrix = unpack_q6_k(random_blocks(gguf.GGMLQuantizationType.Q6_K, n, k, seed=5), n, k)
    assert matrix.kind == "q6" and int(matrix.q.max()) < 64
    arrays = pack(matrix)
    whole, nibbles = arrays["q"], arrays["qh"]
    assert whole.shape == (2, k // 32, 4, 64) and nibbles.shape == (2, k // 32, 2, 64)
    # 6.5 bits a weight with the scales, as in the GGUF file (q8 would take 8.5)
    assert sum(a.nbytes for a in arrays.values()) * 8 / (32 * k) == pytest.approx(6.5, abs=0.07)
    for c in (0, 7, 19):
        block, ch = divmod(c, 16)
        for g in range(k // 32):
            for j in range(4):
                for t in range(4):
                    byte, low = whole[block, g, j, 4 * ch + t], nibbles[block, g, j // 2, 4 * ch + t]
                    assert byte & 0x3F == matrix.q[c, 32 * g + 4 * j + t]
                    b = ((byte >> 6) << 4) | ((low >> (4 * (j % 2))) & 0x0F)
                    assert b == matrix.q[c, 32 * g + 16 + 4 * j + t]


def test_five_bit_values_pack_as_nibbles_and_a_fifth_bit_plane() -> None:
    n, k = 20, 512
    matrix = unpack_q5_k(random_blocks(gguf.GGMLQuantizationType.Q5_K, n, k, seed=6), n, k)
    assert matrix.kind == "q5" and int(matrix.q.max()) == 31
    arrays = pack(matrix)
    nibbles, fifth = arrays["q"], arrays["qh"]
    assert nibbles.shape == (2, k // 32, 4, 64) and fifth.shape == (2, k // 32, 64)
    # 5.625 bits a weight with the scales and mins (the file's 5.5, with each 6-bit scale and min
    # in a byte of its own); q8 would take 8.5
    assert sum(a.nbytes for a in arrays.values()) * 8 / (32 * k) == 5.625
    for c in (0, 7, 19):
        block, ch = divmod(c, 16)
        for g in range(k // 32):
            for j in range(8):
                for t in range(4):
                    byte = nibbles[block, g, j % 4, 4 * ch + t]
                    low = byte & 0x0F if j < 4 else byte >> 4
                    high = (fifth[block, g, 4 * ch + t] >> j) & 1
                    assert low | (high << 4) == matrix.q[c, 32 * g + 4 * j + t]


@pytest.mark.parametrize(("qtype", "unpack", "kind"), SMALL_BLOCK_TYPES)
@pytest.mark.parametrize("n", [16, 50])
def test_packed_size_is_known_before_packing(
    qtype: gguf.GGMLQuantizationType, unpack: Unpacker, kind: str, n: int
) -> None:
    for matrix in (
        unpack(small_blocks(qtype, n, 512), n, 512),
        quantize_q4(np.ones((n, 512))),
        unpack_q5_k(random_blocks(gguf.GGMLQuantizationType.Q5_K, n, 512), n, 512),
        quantize_q8(np.ones((n, 384))),
        unpack_f16(np.ones((n, 384), dtype=np.float16), n, 384),
        unpack_bf16(np.ones((n, 384), dtype=np.uint16), n, 384),
    ):
        expected = sum(a.nbytes for a in pack(matrix).values())
        assert packed_bytes(matrix.kind, n, matrix.shape[1], matrix.super_block) == expected


@pytest.mark.parametrize("qtype", ["F16", "BF16", "F32"])
def test_float_tensors_keep_every_weight_in_a_row_per_channel(qtype: str) -> None:
    """F16 stays half precision; BF16 widens to float32 exactly (gguf-py's dequantizer gives the
    same floats); the packed array is [N/16, 16, K], padded channels zero."""
    n, k = 50, 96
    weights = np.random.default_rng(3).standard_normal((n, k)).astype(np.float32)
    raw = gguf.quants.quantize(weights, gguf.GGMLQuantizationType[qtype])
    matrix = {"F16": unpack_f16, "BF16": unpack_bf16, "F32": unpack_f32}[qtype](raw, n, k)
    assert matrix.kind == ("f16" if qtype == "F16" else "f32")
    reference = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[qtype]).reshape(n, k)
    assert np.array_equal(matrix.dequantize(), reference)
    packed = pack(matrix)["q"]
    assert packed.shape == (4, 16, k) and packed.dtype == (np.float16 if qtype == "F16" else np.float32)
    assert np.array_equal(packed.reshape(64, k)[:n].astype(np.float32), reference)
    assert not packed.reshape(64, k)[n:].any()


def test_the_python_kind_codes_are_the_kernels_kind_enum() -> None:
    """formats.KIND_CODES mirrors core/layout.h's ``enum class Kind`` and its name table."""
    layout = (Path(specchat.kernels.__file__).parent / "core" / "layout.h").read_text()
    enum = re.search(r"enum class Kind : int \{([^}]*)\}", layout)
    assert enum is not None
    codes = {name: int(code) for name, code in re.findall(r"(\w+) = (\d+)", enum.group(1))}
    assert codes == KIND_CODES
    names = dict(re.findall(r'\{Kind::(\w+), "(\w+)"\}', layout))
    assert names == {name: name for name in KIND_CODES}
