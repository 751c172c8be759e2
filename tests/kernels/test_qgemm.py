"""The kernels compute x·Wᵀ on the quantized weights, and each row exactly as a one-row pass, on
every variant (the `isa` fixture runs a test on each one this CPU executes)."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from specchat.kernels import load
from specchat.kernels.formats import (
    KIND_CODES,
    Unpacked,
    quantize_q4,
    quantize_q8,
    unpack_bf16,
    unpack_f16,
    unpack_f32,
    unpack_q5_k,
)
from specchat.kernels.qlinear import QLinear
from tests.kernels.test_formats import SMALL_BLOCK_TYPES, random_blocks, small_blocks


def reference(x: torch.Tensor, weights: np.ndarray, block: int) -> torch.Tensor:
    """What the kernel computes: int8 activations per block of inputs, exact dot products."""
    m, k = x.shape
    blocks = x.reshape(m, k // block, block)
    peak = blocks.abs().amax(-1, keepdim=True)
    inverse = torch.full_like(peak, 127.0) / peak  # float32 division, as the kernel does
    q = torch.round(blocks * inverse)  # rounding half to even
    return (q.double() * (peak.double() / 127.0)).reshape(m, k) @ torch.from_numpy(weights).double().T


@pytest.mark.parametrize("quantize", [quantize_q4, quantize_q8])
@pytest.mark.parametrize(("n", "k"), [(16, 64), (100, 512), (300, 1536)])
def test_output_matches_the_dequantized_weights(isa: str, quantize: object, n: int, k: int) -> None:
    torch.manual_seed(0)
    matrix = quantize(torch.randn(n, k).numpy())  # type: ignore[operator]
    bias = torch.randn(n)
    layer = QLinear(matrix, bias)
    x = torch.randn(5, k)
    expected = reference(x, matrix.dequantize(), matrix.super_block) + bias.double()
    assert torch.allclose(layer(x).double(), expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("quantize", [quantize_q4, quantize_q8])
def test_every_row_is_computed_as_a_one_row_pass(isa: str, quantize: object) -> None:
    torch.manual_seed(1)
    matrix = quantize(torch.randn(200, 1536).numpy())  # type: ignore[operator]
    layer = QLinear(matrix)
    x = torch.randn(20, 1536) * torch.logspace(-2, 2, 20)[:, None]  # rows of very different scales
    alone = torch.cat([layer(x[i : i + 1]) for i in range(20)])
    for width in (2, 3, 5, 8, 9, 16, 20):
        for start in range(0, 20 - width + 1, 7):
            assert torch.equal(layer(x[start : start + width]), alone[start : start + width]), (width, start)


def test_a_zero_row_gives_the_bias() -> None:
    matrix = quantize_q4(np.ones((16, 64), dtype=np.float32))
    bias = torch.arange(16, dtype=torch.float32)
    assert torch.equal(QLinear(matrix, bias)(torch.zeros(2, 64)), bias.expand(2, 16))


def six_bit_values(n: int, k: int, kind: str, seed: int = 3) -> Unpacked:
    """Random Q6_K-range weights (0…63 around 32, int8 scales) held as ``kind`` (q6 or q8)."""
    rng = np.random.default_rng(seed)
    q = rng.integers(0, 64, (n, k), dtype=np.uint8)
    sc = rng.integers(-128, 128, (n, k // 16)).astype(np.int8)
    d = rng.uniform(1e-4, 1e-3, (n, k // 256)).astype(np.float16)
    return Unpacked(kind, q, sc, d, 256, offset=32)


def test_six_bit_weights_compute_bit_for_bit_what_q8_computes_with_them(isa: str) -> None:
    torch.manual_seed(4)
    bias = torch.randn(100)
    six, eight = (QLinear(six_bit_values(100, 512, kind), bias) for kind in ("q6", "q8"))
    x = torch.randn(17, 512) * torch.logspace(-2, 2, 17)[:, None]
    for width in range(1, 18):  # every row tile of the kernel, one pass each
        assert torch.equal(six(x[:width]), eight(x[:width])), width
    expected = reference(x, six_bit_values(100, 512, "q6").dequantize(), 256) + bias.double()
    assert torch.allclose(six(x).double(), expected, rtol=1e-4, atol=1e-4)


def scaled_rows(rows: int, k: int) -> torch.Tensor:
    """Random rows of very different scales (1e-2 to 1e2)."""
    return torch.randn(rows, k) * torch.logspace(-2, 2, rows)[:, None]


def assert_rows_are_one_row_passes(layer: QLinear, x: torch.Tensor) -> None:
    """Every pass over the first 2…len(x) rows gives each row exactly its one-row pass."""
    alone = torch.cat([layer(x[i : i + 1]) for i in range(x.shape[0])])
    for width in range(2, x.shape[0] + 1):
        assert torch.equal(layer(x[:width]), alone[:width]), width


@pytest.mark.parametrize(("qtype", "unpack", "kind"), SMALL_BLOCK_TYPES, ids=lambda v: getattr(v, "name", ""))
def test_small_block_types_compute_their_own_weights_row_by_row(
    isa: str, qtype: object, unpack: object, kind: str
) -> None:
    """Q8_0, Q4_0, Q4_1 and Q5_0 run at their own bits (super-blocks of 32), each row as a one-row pass."""
    torch.manual_seed(5)
    n, k = 100, 512
    matrix = unpack(small_blocks(qtype, n, k, seed=2), n, k)  # type: ignore[arg-type, operator]
    layer = QLinear(matrix)
    x = scaled_rows(9, k)
    assert_rows_are_one_row_passes(layer, x)
    expected = reference(x, matrix.dequantize(), 32)
    assert torch.allclose(layer(x).double(), expected, rtol=1e-4, atol=1e-4)


def test_five_bit_weights_below_16_compute_bit_for_bit_what_q4_computes(isa: str) -> None:
    """q5 is q4 with a fifth bit: where every fifth bit is 0, the two formats give the same bits."""
    n, k = 100, 512
    five = unpack_q5_k(random_blocks(gguf.GGMLQuantizationType.Q5_K, n, k, seed=7), n, k)
    five = Unpacked("q5", five.q & 0x0F, five.sc, five.d, five.super_block, five.mn, five.dm)
    four = Unpacked("q4", five.q, five.sc, five.d, five.super_block, five.mn, five.dm)
    x = torch.randn(9, k) * torch.logspace(-2, 2, 9)[:, None]
    for width in range(1, 10):
        assert torch.equal(QLinear(five)(x[:width]), QLinear(four)(x[:width])), width


def test_q5_k_computes_its_own_weights_row_by_row(isa: str) -> None:
    torch.manual_seed(6)
    n, k = 100, 512
    matrix = unpack_q5_k(random_blocks(gguf.GGMLQuantizationType.Q5_K, n, k, seed=8), n, k)
    assert int(matrix.q.max()) == 31  # the fifth bit is used
    layer = QLinear(matrix)
    x = scaled_rows(9, k)
    assert_rows_are_one_row_passes(layer, x)
    expected = reference(x, matrix.dequantize(), 256)
    assert torch.allclose(layer(x).double(), expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("qtype", ["F16", "BF16", "F32"])
def test_float_weights_compute_the_float_product_row_by_row(isa: str, qtype: str) -> None:
    """F16, BF16 and F32 matrices keep the file's weights and multiply the float input (no int8
    activations): the result is the float product up to summation order, each row a one-row pass."""
    torch.manual_seed(7)
    n, k = 100, 512
    weights = torch.randn(n, k).numpy()
    raw = gguf.quants.quantize(weights, gguf.GGMLQuantizationType[qtype])
    matrix = {"F16": unpack_f16, "BF16": unpack_bf16, "F32": unpack_f32}[qtype](raw, n, k)
    assert np.array_equal(
        matrix.dequantize(), gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[qtype]).reshape(n, k)
    )
    bias = torch.randn(n)
    layer = QLinear(matrix, bias)
    x = scaled_rows(9, k)
    assert_rows_are_one_row_passes(layer, x)
    expected = x.double() @ torch.from_numpy(matrix.dequantize()).double().T + bias.double()
    assert torch.allclose(layer(x).double(), expected, rtol=1e-5, atol=1e-4)


def test_each_variant_reports_the_kind_codes_python_passes(isa: str) -> None:
    """The library's KINDS (core/layout.h's Kind, by name) are formats.KIND_CODES."""
    assert dict(load().KINDS) == KIND_CODES
