"""The batch-invariant kernels: a row's result does not depend on how many rows the pass has.

Run on a CPU through Triton's interpreter (the very programs CUDA compiles), at widths 1–9 and
realistic reduction lengths (K = 1536 and 8960 for the products, 1536-wide norms, an 8192-wide
softmax, 128-wide heads over 300 cached positions; the interpreter is too slow for a whole
vocabulary or a long context, and the order of a row's reduction does not depend on either).
Each check compares the rows of a w-row call with the same rows of the 9-row call, bit for bit,
and with a float64 reference for correctness. A
compile test builds each kernel for the H200's sm_90 with Triton's own ptxas (no GPU needed), so
a kernel that the interpreter accepts but the compiler would not is caught here too.

About 3 minutes on 2 cores, nearly all of it in the interpreter.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

# Before Triton is imported: its own helpers are defined for the interpreter at import time
# (specchat's kernels are defined on first use).
os.environ["TRITON_INTERPRET"] = "1"
pytest.importorskip("triton")

from specchat.kernels import invariant

WIDTHS = range(1, 10)
DTYPES = [torch.float32, torch.bfloat16]


def prefixes_agree(run, x: torch.Tensor) -> None:
    """run(x[:w]) equals the first w rows of run(x[:9]) bit for bit, for every width w."""
    widest = run(x[: max(WIDTHS)])
    for width in WIDTHS:
        assert torch.equal(run(x[:width]), widest[:width]), f"width {width} differs"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("dtype", "n", "k"), [(torch.float32, 64, 1536), (torch.bfloat16, 64, 1536), (torch.bfloat16, 64, 8960)]
)
def test_linear_rows_do_not_depend_on_the_width(dtype: torch.dtype, n: int, k: int) -> None:
    generator = torch.Generator().manual_seed(k)
    weight = (torch.randn(n, k, generator=generator) * 0.02).to(dtype)
    bias = torch.randn(n, generator=generator).to(dtype)
    x = torch.randn(9, k, generator=generator).to(dtype)
    assert invariant.splits_for(n, k) > 1  # the split-K path, the one a shape-dependent order would break
    prefixes_agree(lambda rows: invariant.linear(rows, weight, bias), x)
    reference = x.double() @ weight.double().T + bias.double()
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    assert torch.allclose(
        invariant.linear(x, weight, bias).double(), reference, atol=tolerance, rtol=tolerance
    )


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_rows_do_not_depend_on_the_width(dtype: torch.dtype) -> None:
    x = torch.randn(9, 1536, generator=torch.Generator().manual_seed(1)).to(dtype)
    prefixes_agree(lambda rows: invariant.rms_inverse(rows, 1e-6), x)
    reference = torch.rsqrt(x.double().pow(2).mean(-1, keepdim=True) + 1e-6)
    assert torch.allclose(invariant.rms_inverse(x, 1e-6).double(), reference, rtol=1e-5)


@pytest.mark.parametrize("dtype", DTYPES)
def test_softmax_rows_do_not_depend_on_the_width(dtype: torch.dtype) -> None:
    x = (torch.randn(9, 8192, generator=torch.Generator().manual_seed(2)) * 4).to(dtype)
    x[3, 1000:] = float("-inf")  # a masked row (top-k) keeps its zeros
    prefixes_agree(invariant.softmax, x)
    assert torch.allclose(invariant.softmax(x).double(), torch.softmax(x.double(), -1), atol=1e-7)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("window", [None, 100])
def test_attention_rows_do_not_depend_on_the_width(dtype: torch.dtype, window: int | None) -> None:
    generator = torch.Generator().manual_seed(3)
    heads, kv_heads, dim, capacity, start = 4, 2, 128, 512, 300
    query = torch.randn(1, heads, 9, dim, generator=generator).to(dtype)
    key = torch.randn(1, kv_heads, capacity, dim, generator=generator).to(dtype)
    value = torch.randn(1, kv_heads, capacity, dim, generator=generator).to(dtype)
    positions = torch.arange(start, start + 9)
    at = torch.arange(capacity)
    mask = at[None, :] <= positions[:, None]
    if window is not None:
        mask &= at[None, :] > positions[:, None] - window

    def run(rows: int) -> torch.Tensor:
        return invariant.attention(query[:, :, :rows], key, value, mask[None, None, :rows], dim**-0.5)[0]

    widest = run(9)
    for width in WIDTHS:
        assert torch.equal(run(width), widest[:width]), f"width {width} differs"
    groups = heads // kv_heads
    reference = torch.nn.functional.scaled_dot_product_attention(
        query.double(),
        key.double().repeat_interleave(groups, 1),
        value.double().repeat_interleave(groups, 1),
        attn_mask=mask[None, None],
        scale=dim**-0.5,
    ).transpose(1, 2)[0]
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    assert torch.allclose(widest.double(), reference, atol=tolerance, rtol=tolerance)


@pytest.mark.slow
def test_the_kernels_compile_for_the_h200() -> None:
    """Each program through Triton's compiler to sm_90 machine code (ptxas ships with Triton).

    In a child process: this one defined Triton's own helpers for the interpreter at import, and
    the compiler cannot lower those.
    """
    child = subprocess.run(
        [sys.executable, "-m", "tests.kernels.compile_for_sm90"],
        env={**os.environ, "TRITON_INTERPRET": "0"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert child.returncode == 0, child.stderr[-3000:]
    compiled = {
        tuple(line.split()[1:3]) for line in child.stdout.splitlines() if line.startswith("compiled ")
    }
    names = {"matmul_partial", "sum_splits", "rms_inverse", "softmax_rows", "attention_rows"}
    assert {name for name, _ in compiled} == names, child.stdout
    assert {dt for _, dt in compiled} == {"bf16", "fp32"}, child.stdout
