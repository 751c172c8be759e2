"""QLinear: a linear layer on block-quantized weights, computed by qgemm.cpp."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from specchat.kernels import load
from specchat.kernels.formats import KIND_CODES, Unpacked, pack


def qmat(
    matrix: Unpacked, bias: torch.Tensor | None = None, tensors: dict[str, torch.Tensor] | None = None
) -> Any:
    """The kernel's handle on one matrix (``tensors``: already packed, e.g. memory-mapped from the cache)."""
    if tensors is None:
        tensors = {name: torch.from_numpy(array) for name, array in pack(matrix).items()}
    return qmat_from_tensors(matrix.kind, tensors, matrix.super_block, matrix.offset, matrix.shape[0], bias)


def qmat_from_tensors(
    kind: str,
    tensors: dict[str, torch.Tensor],
    super_block: int,
    offset: int,
    rows: int,
    bias: torch.Tensor | None,
) -> Any:
    padded_bias = None
    if bias is not None:
        padded_bias = torch.zeros(tensors["q"].shape[0] * 16, dtype=torch.float32)
        padded_bias[:rows] = bias.float()
    none = torch.empty(0, dtype=torch.uint8)  # the float kinds have no scales
    return load().QMat(
        KIND_CODES[kind],  # core/layout.h's Kind
        tensors["q"],
        tensors.get("sc", none),
        tensors.get("mn"),
        tensors.get("d", none),
        tensors.get("dm"),
        super_block,
        offset,
        rows,
        padded_bias,
        tensors.get("qh"),
    )


class QLinear(nn.Module):
    """x · Wᵀ (+ b) with W in any packed format (formats.py); every output row depends on its input row only.

    ``weight`` is a meta tensor of the original shape, so code that asks a layer for its width
    still gets the right answer, and code that tries to compute with it fails loudly.
    """

    def __init__(self, matrix: Unpacked, bias: torch.Tensor | None = None) -> None:
        super().__init__()
        self.kind = matrix.kind
        self.out_features, self.in_features = matrix.shape
        self.mat = qmat(matrix, bias)

    @property
    def weight(self) -> torch.Tensor:
        return torch.empty(self.out_features, self.in_features, device="meta")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        out = self.mat.forward(x.reshape(-1, shape[-1]))[:, : self.out_features]
        return out.reshape(*shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, kind={self.kind}"
