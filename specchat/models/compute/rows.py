"""Row-by-row exactness for Hugging Face models: each row of a verify pass as a one-token pass.

A verify pass over γ+1 positions must reproduce the γ+1 single-token passes of plain decoding
bit for bit, or speculative output would differ from plain decoding. Stock kernels (MKL's fp32
GEMM, SDPA, bitsandbytes' layers) sum a row differently when it shares a pass with others; the
helpers here make short passes compute each row alone, and leave prefills (the same call in
both loops) on the fast batched path. Used by the plain CPU path (cpu_quant) and by --quant
(quant), which is why they live below both.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable

import torch
from torch import nn

ROWS_ALONE_FLAG = "_specchat_rows_alone"

ROW_ATTENTION = "specchat_rows"
ROW_LIMIT = 32
"""Passes over at most this many new positions (decoding, verification) attend row by row."""


def row_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: object,
) -> tuple[torch.Tensor, None]:
    """Attention that computes every query row exactly as a one-token pass would.

    A verify pass over γ+1 positions must reproduce, bit for bit, the γ+1 single-token passes
    of plain decoding. SDPA over several query rows takes other code paths (other blocking,
    other summation order) than over one, so short passes run one SDPA call per row, each
    identical to the call a one-token pass makes: query row i sees keys 0 … kv − L + i. Longer
    passes (prefill, shared by both loops) and padded batches use the stock SDPA path.
    """
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    batch, heads, length, dim = query.shape
    if batch != 1 or length > ROW_LIMIT:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout, scaling, **kwargs)  # type: ignore[arg-type]
    kv_heads = key.shape[1]
    groups = heads // kv_heads
    kv_length = key.shape[2]
    rows = []
    for i in range(length):
        q = query[:, :, i : i + 1, :].reshape(batch, kv_heads, groups, dim)
        seen = kv_length - length + i + 1
        out = torch.nn.functional.scaled_dot_product_attention(
            q, key[:, :, :seen, :], value[:, :, :seen, :], scale=scaling
        )
        rows.append(out.reshape(batch, heads, 1, value.shape[-1]))
    attn = rows[0] if length == 1 else torch.cat(rows, dim=2)
    return attn.transpose(1, 2).contiguous(), None


def use_row_attention(model: nn.Module) -> None:
    """Switch ``model`` to :func:`row_attention_forward` (registered once with transformers)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(ROW_ATTENTION, row_attention_forward)
    AttentionMaskInterface.register(ROW_ATTENTION, sdpa_mask)
    model.set_attn_implementation(ROW_ATTENTION)  # type: ignore[operator]


def compute_rows_alone(model: nn.Module) -> list[str]:
    """Make every verify pass of ``model`` compute each row as a one-token pass would (in place).

    Returns the names of the linear layers that now run once per row. Their types, names and
    weights are unchanged (transformers' and bitsandbytes' own code keeps recognising them):
    only the instance's ``forward`` is replaced.
    """
    use_row_attention(model)
    changed = []
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear) and not getattr(module, ROWS_ALONE_FLAG, False):
            if batched_rows_are_exact(module):
                continue
            setattr(module, "forward", one_row_at_a_time(module.forward))  # noqa: B010 (an instance's forward)
            setattr(module, ROWS_ALONE_FLAG, True)
            changed.append(name)
    return changed


Forward = Callable[[torch.Tensor], torch.Tensor]


def one_row_at_a_time(batched: Forward) -> Forward:
    """``batched`` for long passes and batches; one call per row for a verify-sized pass.

    Only verify passes (at most γ_max + 1 positions) must match one-token passes; prefills are
    the same call in plain and speculative decoding, so they keep the faster batched product.
    """
    from specchat.params import GAMMA_MAX

    def forward(x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 3 or x.shape[0] != 1 or not 1 < x.shape[1] <= GAMMA_MAX + 1:
            return batched(x)
        # A fresh tensor per row: kernels may pick their code path by the input's alignment,
        # and a one-token pass always hands them a fresh allocation.
        return torch.cat([batched(x[:, i : i + 1].clone()) for i in range(x.shape[1])], dim=1)

    return forward


def batched_rows_are_exact(module: nn.Module) -> bool:
    """True only where bitsandbytes' own CPU 4-bit kernel (AVX512-BF16) will run this layer.

    That kernel keeps one accumulator per row and walks the weights in the same order for 1
    row as for 32; any other kernel gets the row-by-row treatment. If bitsandbytes found the
    optional hub kernel instead (``kernels`` installed, with a network), it is not ours to vouch
    for, so that case counts as not exact.
    """
    if importlib.util.find_spec("bitsandbytes") is None:
        return False
    import bitsandbytes as bnb

    if not isinstance(module, bnb.nn.Linear4bit) or module.weight.device.type != "cpu":
        return False
    if not getattr(module, "support_avx512bf16_for_cpu", False):
        return False
    from bitsandbytes.backends.cpu import ops

    return getattr(ops, "gemm_4bit_forward_kernel", "absent") is None
