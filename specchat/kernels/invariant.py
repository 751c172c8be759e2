"""Batch-invariant kernels: each row is reduced in the same order whatever the number of rows.

Why: a verify pass scores γ+1 positions at once, plain decoding one at a time. Greedy
speculative output equals plain decoding only if row i of the verify pass is bit for bit the
one-row pass. Stock GPU kernels do not promise that: cuBLAS and the reductions behind RMSNorm,
softmax and attention pick their tiling, split-K and block counts from the shape, so a row's sum
is ordered differently in a pass of 1 row than in a pass of 5 (the problem vLLM's batch-invariant
mode and Thinking Machines' batch_invariant_ops solve the same way).

Each kernel here fixes its reduction order from the row length (and the weight's shape) alone:

- :func:`linear`: tiles of 16 rows × 64 columns, K walked in 64-wide steps in order, split into
  a number of K-slices chosen from (N, K) only, summed slice by slice in order afterwards;
- :func:`rms_inverse`: one program per row, the squares summed in 1024-wide chunks in order;
- :func:`softmax`: one program per row, online maximum and sum in chunks, in order;
- :func:`attention`: one program per (head, query row), keys walked in 64-wide blocks from the
  row's first visible position to its last, with an online softmax.

A row never shares an accumulator with another, and padding rows to a tile's 16 is masked, so
width 1 and width 9 run the same instructions on each row. They are Triton kernels: on CUDA they
compile for the GPU; on a CPU, Triton's interpreter (``TRITON_INTERPRET=1``) runs the very same
programs, which is how tests check width-independence without a GPU.

:func:`apply` switches a transformers model to them (its linear layers, RMSNorms and attention);
passes wider than :data:`INVARIANT_ROWS` (prefills, the same call in both loops) keep the stock
kernels.
"""

from __future__ import annotations

import functools
import importlib.util
import os
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

INVARIANT_ROWS = 32
"""Passes over at most this many positions (decoding and verification) use these kernels."""
BLOCK_M, BLOCK_N, BLOCK_K = 16, 64, 64
"""The matmul's tile: rows, output columns, reduction step."""
NORM_BLOCK = 1024
SOFTMAX_BLOCK = 2048
ATTENTION_BLOCK = 64
TARGET_PROGRAMS = 256
"""The matmul splits K until about this many programs run (two per multiprocessor on an H200):
a one-row product over a few output tiles would otherwise leave most of the GPU idle."""
MAX_SPLITS = 16
ATTENTION_NAME = "specchat_invariant"
INVARIANT_FLAG = "_specchat_invariant"


def available() -> str | None:
    """None when the kernels can run here, else why not (one line)."""
    if importlib.util.find_spec("triton") is None:
        return "Triton is not installed (it comes with torch's CUDA wheels)"
    if not (torch.cuda.is_available() or interpreting()):
        return "no CUDA device (on a CPU, only Triton's interpreter runs them: TRITON_INTERPRET=1)"
    return None


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


# The Triton programs are defined on first use, each group by its own function: Triton reads
# TRITON_INTERPRET when they are.


@functools.cache
def _matmul_programs() -> tuple[Any, Any]:
    """:func:`linear`'s programs: the partial products of each K-slice, then their sum in order."""
    import triton
    import triton.language as tl

    @triton.jit
    def matmul_partial(
        x_ptr, w_ptr, out_ptr, M, N, K,
        stride_xm, stride_wn, stride_os, stride_om,
        K_PER_SPLIT: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
    ):  # fmt: skip
        pid_n = tl.program_id(0)
        pid_m = tl.program_id(1)
        split = tl.program_id(2)
        rows = pid_m * BM + tl.arange(0, BM)
        cols = pid_n * BN + tl.arange(0, BN)
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        k_start = split * K_PER_SPLIT
        for k0 in range(0, K_PER_SPLIT, BK):
            ks = k_start + k0 + tl.arange(0, BK)
            k_ok = ks < K
            x = tl.load(
                x_ptr + rows[:, None] * stride_xm + ks[None, :],
                mask=(rows[:, None] < M) & k_ok[None, :],
                other=0.0,
            )
            w = tl.load(
                w_ptr + cols[None, :] * stride_wn + ks[:, None],
                mask=(cols[None, :] < N) & k_ok[:, None],
                other=0.0,
            )
            # fp32 operands: bf16 widens exactly, and TF32 holds a bf16 value exactly too.
            acc = tl.dot(x.to(tl.float32), w.to(tl.float32), acc)
        out = out_ptr + split * stride_os + rows[:, None] * stride_om + cols[None, :]
        tl.store(out, acc, mask=(rows[:, None] < M) & (cols[None, :] < N))

    @triton.jit
    def sum_splits(
        part_ptr, bias_ptr, out_ptr, M, N, SPLITS: tl.constexpr, HAS_BIAS: tl.constexpr, BN: tl.constexpr
    ):
        row = tl.program_id(0)
        cols = tl.program_id(1) * BN + tl.arange(0, BN)
        ok = cols < N
        total = tl.load(part_ptr + row * N + cols, mask=ok, other=0.0)
        for s in range(1, SPLITS):
            total += tl.load(part_ptr + s * M * N + row * N + cols, mask=ok, other=0.0)
        if HAS_BIAS:
            total += tl.load(bias_ptr + cols, mask=ok, other=0.0).to(tl.float32)
        tl.store(out_ptr + row * N + cols, total.to(out_ptr.dtype.element_ty), mask=ok)

    return matmul_partial, sum_splits


@functools.cache
def _row_programs() -> tuple[Any, Any]:
    """:func:`rms_inverse`'s and :func:`softmax`'s programs: one program per row."""
    import triton
    import triton.language as tl

    @triton.jit
    def rms_inverse(x_ptr, out_ptr, stride, eps, H: tl.constexpr, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        acc = tl.zeros((BLOCK,), dtype=tl.float32)
        for start in range(0, H, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            x = tl.load(x_ptr + row * stride + cols, mask=cols < H, other=0.0).to(tl.float32)
            acc += x * x
        mean = tl.sum(acc, axis=0) / H
        tl.store(out_ptr + row, 1.0 / tl.sqrt(mean + eps))

    @triton.jit
    def softmax_rows(x_ptr, out_ptr, stride, V: tl.constexpr, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        run_max = tl.full((BLOCK,), float("-inf"), dtype=tl.float32)
        run_sum = tl.zeros((BLOCK,), dtype=tl.float32)
        for start in range(0, V, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            x = tl.load(x_ptr + row * stride + cols, mask=cols < V, other=float("-inf")).to(tl.float32)
            new_max = tl.maximum(run_max, x)
            scale = tl.where(new_max == float("-inf"), 0.0, tl.exp(run_max - new_max))
            run_sum = run_sum * scale + tl.where(x == float("-inf"), 0.0, tl.exp(x - new_max))
            run_max = new_max
        top = tl.max(run_max, axis=0)
        total = tl.sum(run_sum * tl.where(run_max == float("-inf"), 0.0, tl.exp(run_max - top)), axis=0)
        for start in range(0, V, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            x = tl.load(x_ptr + row * stride + cols, mask=cols < V, other=float("-inf")).to(tl.float32)
            tl.store(out_ptr + row * stride + cols, tl.exp(x - top) / total, mask=cols < V)

    return rms_inverse, softmax_rows


@functools.cache
def _attention_program() -> Any:
    """:func:`attention`'s program: one per (head, query row)."""
    import triton
    import triton.language as tl

    @triton.jit
    def attention_rows(
        q_ptr, k_ptr, v_ptr, first_ptr, last_ptr, out_ptr, scale,
        stride_qh, stride_qm, stride_kh, stride_kn, stride_vh, stride_vn, stride_oh, stride_om,
        C: tl.constexpr, GROUPS: tl.constexpr, D: tl.constexpr, BLOCK: tl.constexpr,
    ):  # fmt: skip
        head = tl.program_id(0)
        row = tl.program_id(1)
        kv_head = head // GROUPS
        dims = tl.arange(0, D)
        q = tl.load(q_ptr + head * stride_qh + row * stride_qm + dims).to(tl.float32)
        first = tl.load(first_ptr + row)
        last = tl.load(last_ptr + row)
        run_max = tl.max(tl.full((BLOCK,), float("-inf"), dtype=tl.float32), axis=0)
        run_sum = tl.sum(tl.zeros((BLOCK,), dtype=tl.float32), axis=0)
        acc = tl.zeros((D,), dtype=tl.float32)
        # Every block in order; those outside the row's span are skipped whole (the span, and so
        # the blocks summed, depend on the row's position alone).
        for start in range(0, C, BLOCK):
            if (start <= last) & (start + BLOCK > first):
                keys_at = start + tl.arange(0, BLOCK)
                seen = (keys_at >= first) & (keys_at <= last)
                k = tl.load(
                    k_ptr + kv_head * stride_kh + keys_at[:, None] * stride_kn + dims[None, :],
                    mask=seen[:, None],
                    other=0.0,
                ).to(tl.float32)
                scores = tl.where(seen, tl.sum(k * q[None, :], axis=1) * scale, float("-inf"))
                new_max = tl.maximum(run_max, tl.max(scores, axis=0))
                alpha = tl.exp(run_max - new_max)
                p = tl.where(seen, tl.exp(scores - new_max), 0.0)
                v = tl.load(
                    v_ptr + kv_head * stride_vh + keys_at[:, None] * stride_vn + dims[None, :],
                    mask=seen[:, None],
                    other=0.0,
                ).to(tl.float32)
                acc = acc * alpha + tl.sum(p[:, None] * v, axis=0)
                run_sum = run_sum * alpha + tl.sum(p, axis=0)
                run_max = new_max
        out = acc / run_sum
        tl.store(out_ptr + head * stride_oh + row * stride_om + dims, out.to(out_ptr.dtype.element_ty))

    return attention_rows


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def splits_for(n: int, k: int) -> int:
    """K-slices of a product with this weight shape: a function of the weight alone, never of M."""
    tiles = -(-n // BLOCK_N)
    steps = -(-k // BLOCK_K)
    splits = 1
    while tiles * splits < TARGET_PROGRAMS and splits * 2 <= min(MAX_SPLITS, steps):
        splits *= 2
    return splits


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., K] @ weight[N, K]ᵀ (+ bias), each row reduced in an order fixed by the weight's shape."""
    matmul_partial, sum_splits = _matmul_programs()
    shape = x.shape
    rows = x.reshape(-1, shape[-1]).contiguous()
    weight = weight.contiguous()
    m, k = rows.shape
    n = weight.shape[0]
    splits = splits_for(n, k)
    k_per_split = ceil_div(ceil_div(k, splits), BLOCK_K) * BLOCK_K
    partial = torch.empty(splits, m, n, dtype=torch.float32, device=x.device)
    grid = (ceil_div(n, BLOCK_N), ceil_div(m, BLOCK_M), splits)
    matmul_partial[grid](
        rows, weight, partial, m, n, k,
        rows.stride(0), weight.stride(0), partial.stride(0), partial.stride(1),
        K_PER_SPLIT=k_per_split, BM=BLOCK_M, BN=BLOCK_N, BK=BLOCK_K,
    )  # fmt: skip
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    has_bias = bias is not None
    sum_splits[(m, -(-n // 256))](
        partial, bias if has_bias else partial, out, m, n, SPLITS=splits, HAS_BIAS=has_bias, BN=256
    )
    return out.reshape(*shape[:-1], n)


def rms_inverse(x: torch.Tensor, eps: float) -> torch.Tensor:
    """1 / sqrt(mean(x²) + eps) per row of x [..., H], in float32: the reduction RMSNorm needs."""
    kernel, _ = _row_programs()
    rows = x.reshape(-1, x.shape[-1]).contiguous()
    out = torch.empty(rows.shape[0], dtype=torch.float32, device=x.device)
    kernel[(rows.shape[0],)](rows, out, rows.stride(0), eps, H=rows.shape[1], BLOCK=NORM_BLOCK)
    return out.reshape(*x.shape[:-1], 1)


def softmax(x: torch.Tensor) -> torch.Tensor:
    """Softmax over the last dimension, in float32, row by row in a fixed order."""
    _, kernel = _row_programs()
    rows = x.reshape(-1, x.shape[-1]).contiguous()
    out = torch.empty(rows.shape, dtype=torch.float32, device=x.device)
    kernel[(rows.shape[0],)](rows, out, rows.stride(0), V=rows.shape[1], BLOCK=SOFTMAX_BLOCK)
    return out.reshape(x.shape)


def visible_span(mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each query row's first and last visible key position, from a boolean mask [..., M, C]."""
    allowed = mask.reshape(-1, mask.shape[-2], mask.shape[-1])[0]
    at = torch.arange(allowed.shape[-1], device=mask.device)
    first = torch.where(allowed, at, allowed.shape[-1]).amin(-1)
    last = torch.where(allowed, at, -1).amax(-1)
    return first.to(torch.int32).contiguous(), last.to(torch.int32).contiguous()


def attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor, scale: float
) -> torch.Tensor:
    """softmax(q·kᵀ·scale, masked) · v for q [1, H, M, D], k/v [1, KVH, C, D]; returns [1, M, H, D].

    The mask must let each row see one contiguous span of keys (causal, with or without a window).
    """
    kernel = _attention_program()
    _, heads, m, dim = query.shape
    kv_heads = key.shape[1]
    first, last = visible_span(mask)
    q, k, v = query[0], key[0], value[0]
    out = torch.empty(m, heads, dim, dtype=query.dtype, device=query.device)
    kernel[(heads, m)](
        q, k, v, first, last, out, scale,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        out.stride(1), out.stride(0),
        C=key.shape[2], GROUPS=heads // kv_heads, D=dim, BLOCK=ATTENTION_BLOCK,
    )  # fmt: skip
    return out[None]


# ---------------------------------------------------------------------- applying them to a model


def attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: object,
) -> tuple[torch.Tensor, None]:
    """transformers' attention interface, on :func:`attention` for short passes with a boolean mask."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    short = (
        query.shape[0] == 1
        and query.shape[2] <= INVARIANT_ROWS
        and query.shape[-1] & (query.shape[-1] - 1) == 0
    )
    if not short or attention_mask is None or attention_mask.dtype != torch.bool or kwargs.get("softcap"):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout, scaling, **kwargs)  # type: ignore[arg-type]
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    return attention(query, key, value, attention_mask, scale), None


def short_pass(x: torch.Tensor) -> bool:
    rows = x.numel() // x.shape[-1]
    return rows <= INVARIANT_ROWS


def invariant_linear_forward(module: nn.Linear) -> Callable[[torch.Tensor], torch.Tensor]:
    stock = module.forward

    def forward(x: torch.Tensor) -> torch.Tensor:
        if not short_pass(x):
            return stock(x)
        return linear(x, module.weight, module.bias)

    return forward


def invariant_norm_forward(module: nn.Module, one_plus: bool) -> Callable[[torch.Tensor], torch.Tensor]:
    """An RMSNorm's forward with the row's reduction on :func:`rms_inverse`.

    The rest is element-wise, written as transformers writes it: ``weight * x̂`` in the input's
    dtype (Llama, Qwen), or ``x̂ * (1 + weight)`` in float32 (Gemma).
    """
    stock = module.forward
    eps = float(getattr(module, "variance_epsilon", getattr(module, "eps", 1e-6)))

    def forward(x: torch.Tensor) -> torch.Tensor:
        if not short_pass(x):
            return stock(x)
        weight = module.weight
        assert isinstance(weight, torch.Tensor)
        normed = x.float() * rms_inverse(x, eps)
        if one_plus:
            return (normed * (1.0 + weight.float())).type_as(x)
        return weight * normed.to(x.dtype)

    return forward


def is_rms_norm(module: nn.Module) -> bool:
    return type(module).__name__.endswith("RMSNorm") and hasattr(module, "weight")


def apply(model: nn.Module) -> dict[str, int]:
    """Switch ``model``'s linear layers, RMSNorms and attention to the batch-invariant kernels.

    Returns how many of each were switched. Layers other than plain ``nn.Linear`` (bitsandbytes')
    are left alone: their kernels are not ours to order.
    """
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    counts = {"linear": 0, "rms_norm": 0}
    for module in model.modules():
        if getattr(module, INVARIANT_FLAG, False):
            continue
        if type(module) is nn.Linear:
            setattr(module, "forward", invariant_linear_forward(module))  # noqa: B010 (an instance's forward)
            counts["linear"] += 1
        elif is_rms_norm(module):
            one_plus = "Gemma" in type(module).__name__
            setattr(module, "forward", invariant_norm_forward(module, one_plus))  # noqa: B010
            counts["rms_norm"] += 1
        else:
            continue
        setattr(module, INVARIANT_FLAG, True)
    AttentionInterface.register(ATTENTION_NAME, attention_forward)
    AttentionMaskInterface.register(ATTENTION_NAME, sdpa_mask)
    model.set_attn_implementation(ATTENTION_NAME)  # type: ignore[operator]
    return counts
