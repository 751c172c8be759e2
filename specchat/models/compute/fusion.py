"""Sibling projections fused into one GEMM on the CPU paths.

Llama-style layers project the same input three times (q, k, v) and twice (gate, up); one packed
GEMM over the stacked weights reads the activations once. The first sibling runs it and hands the
split outputs to the others, which must be called next, in order, on the same input.
"""

from __future__ import annotations

import torch
from torch import nn

from specchat.models.compute.packed_linear import PackedLinear

FUSED_GROUPS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))
"""Sibling projections that read the same input (Llama, Qwen2, Mistral …): one GEMM each group."""


class _Shared:
    """The fused GEMM's input and its split outputs, handed from the first sibling to the rest."""

    def __init__(self, names: tuple[str, ...]) -> None:
        self.names = names
        self.input: torch.Tensor | None = None
        self.outputs: tuple[torch.Tensor, ...] = ()


class FusedFirst(nn.Module):
    """Stands in for the first projection of a group: runs the one GEMM for all of them."""

    def __init__(self, packed: PackedLinear, widths: list[int], shared: _Shared, in_features: int) -> None:
        super().__init__()
        self.packed = packed
        self.widths = widths
        self.shared = shared
        self.in_features = in_features
        self.out_features = widths[0]

    @property
    def weight(self) -> torch.Tensor:
        return torch.empty(self.out_features, self.in_features, device="meta")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        outputs = self.packed(x).split(self.widths, dim=-1)
        self.shared.input, self.shared.outputs = x, outputs
        return outputs[0]


class FusedRest(nn.Module):
    """Stands in for a later projection of a group: returns its slice of the fused output."""

    def __init__(self, index: int, shared: _Shared, in_features: int, out_features: int) -> None:
        super().__init__()
        self.index = index
        self.shared = shared
        self.in_features = in_features
        self.out_features = out_features

    @property
    def weight(self) -> torch.Tensor:
        return torch.empty(self.out_features, self.in_features, device="meta")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shared = self.shared
        if x is not shared.input:
            raise RuntimeError(
                f"fused {'/'.join(shared.names)} called out of order: the model's forward changed"
            )
        out = shared.outputs[self.index]
        if self.index == len(shared.outputs) - 1:
            shared.input, shared.outputs = None, ()
        return out


def fuse_groups(module: nn.Module, mode: str) -> bool:
    """Fuse every complete group of sibling Linears in ``module``; True if any was fused."""
    fused = False
    for names in FUSED_GROUPS:
        layers = [getattr(module, name, None) for name in names]
        if not all(isinstance(layer, nn.Linear) for layer in layers):
            continue
        linears: list[nn.Linear] = layers  # type: ignore[assignment]
        if len({layer.in_features for layer in linears}) != 1:
            continue
        weight = torch.cat([layer.weight.detach() for layer in linears])
        biases = [layer.bias for layer in linears]
        bias = None
        if any(b is not None for b in biases):
            bias = torch.cat(
                [
                    b.detach() if b is not None else torch.zeros(layer.out_features)
                    for b, layer in zip(biases, linears, strict=True)
                ]
            )
        shared = _Shared(names)
        widths = [layer.out_features for layer in linears]
        in_features = linears[0].in_features
        setattr(
            module,
            names[0],
            FusedFirst(PackedLinear.from_tensors(weight, bias, mode), widths, shared, in_features),
        )
        for index, name in enumerate(names[1:], start=1):
            setattr(module, name, FusedRest(index, shared, in_features, widths[index]))
        fused = True
    return fused
