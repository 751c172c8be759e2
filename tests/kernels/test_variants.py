"""Every variant of the kernels (avx512, avx2, scalar) computes each row as a one-row pass, and the
SIMD variants compute the scalar reference's bits: the same packed weights give the same logits
on any CPU, so speculation stays exact whichever variant runs."""

from __future__ import annotations

from collections.abc import Callable

import gguf
import numpy as np
import pytest
import torch

from specchat.kernels.formats import Unpacked, quantize_q4, quantize_q8, unpack_f16, unpack_f32, unpack_q5_k
from specchat.kernels.native import NativeCausalLM
from specchat.kernels.qlinear import QLinear
from specchat.models.compute.packing import from_hf
from specchat.testing.tiny_models import make_model, make_tokenizer
from tests.kernels.conftest import use_variant
from tests.kernels.test_formats import random_blocks
from tests.kernels.test_qgemm import six_bit_values

KINDS = ("q4", "q5", "q6", "q8", "q8-extreme", "f16", "f32")
WIDTHS = range(1, 9)
"""Every row tile of every variant (the widest tile is 8 rows)."""


def extreme_q8(n: int, k: int) -> Unpacked:
    """q8 weights at 0 and 255 only: with inputs at ±127, pairs of products reach 2·255·127, past
    what a 16-bit multiply-add holds (AVX2 must not saturate there)."""
    rng = np.random.default_rng(7)
    q = np.where(rng.random((n, k)) < 0.8, 255, 0).astype(np.uint8)
    sc = rng.integers(1, 128, (n, k // 16)).astype(np.int8)
    d = rng.uniform(1e-4, 1e-3, (n, k // 256)).astype(np.float16)
    return Unpacked("q8", q, sc, d, 256, offset=128)


def matrix(kind: str) -> Unpacked:
    weights = np.random.default_rng(11).standard_normal((100, 512)).astype(np.float32)
    makers: dict[str, Callable[[], Unpacked]] = {
        "q4": lambda: quantize_q4(weights),
        "q8": lambda: quantize_q8(weights),
        "q6": lambda: six_bit_values(100, 512, "q6"),
        "q8-extreme": lambda: extreme_q8(100, 512),
        "q5": lambda: unpack_q5_k(random_blocks(gguf.GGMLQuantizationType.Q5_K, 100, 512, seed=4), 100, 512),
        "f16": lambda: unpack_f16(weights.astype(np.float16), 100, 512),
        "f32": lambda: unpack_f32(weights, 100, 512),
    }
    return makers[kind]()


def inputs(rows: int = 12, k: int = 512) -> torch.Tensor:
    """Rows of very different scales, and rows whose every input quantizes to ±127."""
    torch.manual_seed(5)
    x = torch.randn(rows, k) * torch.logspace(-2, 2, rows)[:, None]
    x[0] = 3.0
    x[1] = torch.where(torch.arange(k) % 3 == 0, -2.0, 2.0)
    return x


@pytest.mark.parametrize("kind", KINDS)
def test_every_row_of_a_pass_is_its_one_row_pass(isa: str, kind: str) -> None:
    layer, x = QLinear(matrix(kind)), inputs()
    alone = torch.cat([layer(x[i : i + 1]) for i in range(x.shape[0])])
    for width in WIDTHS:
        for start in range(0, x.shape[0] - width + 1, 3):
            got = layer(x[start : start + width])
            assert torch.equal(got, alone[start : start + width]), (isa, kind, width, start)


@pytest.mark.parametrize("kind", KINDS)
def test_simd_matrices_give_the_scalar_bits(simd: str, kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    x, bias = inputs(), torch.linspace(-1, 1, 100)
    fast = QLinear(matrix(kind), bias)(x)
    use_variant(monkeypatch, "scalar")
    reference = QLinear(matrix(kind), bias)(x)
    assert torch.equal(fast, reference), float((fast - reference).abs().max())


IDS = torch.tensor([[1, 5, 9, 12, 7, 30, 22, 4] * 4])
PREFIX = 8


def logits(model: NativeCausalLM, ids: torch.Tensor, cache: object = None) -> torch.Tensor:
    return model(ids, cache, logits_to_keep=ids.shape[1]).logits[0]


@pytest.mark.parametrize("bits", [4, 8])
def test_a_model_pass_of_every_width_equals_one_position_passes(isa: str, bits: int) -> None:
    # 256 wide: the MLP's down projection spans two super-blocks, so their scaling order counts
    native = from_hf(make_model(len(make_tokenizer()), seed=1, hidden_size=256, heads=4), bits=bits)
    one_by_one, cache = [], native.new_cache()
    for i in range(PREFIX + max(WIDTHS)):
        one_by_one.append(logits(native, IDS[:, i : i + 1], cache))
    alone = torch.cat(one_by_one)
    for width in WIDTHS:
        cache.crop(PREFIX)
        got = logits(native, IDS[:, PREFIX : PREFIX + width], cache)
        assert torch.equal(got, alone[PREFIX : PREFIX + width]), (isa, bits, width)


@pytest.mark.parametrize(("hidden", "heads", "bits"), [(64, 4, 8), (256, 4, 4), (256, 2, 8)])
def test_simd_models_give_the_scalar_logits(
    simd: str, hidden: int, heads: int, bits: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Head widths 16, 64 and 128 (the attention sums in registers at 64 and 128), norms, softmax."""
    model = make_model(len(make_tokenizer()), seed=5, hidden_size=hidden, heads=heads, logit_scale=2.0)
    fast = logits(from_hf(model, bits=bits), IDS)
    use_variant(monkeypatch, "scalar")
    reference = logits(from_hf(model, bits=bits), IDS)
    assert torch.equal(fast, reference), float((fast - reference).abs().max())
