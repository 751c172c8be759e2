"""Exact mode on CUDA: every pass of the target (and the sampling softmax) on batch-invariant kernels.

A verify pass then computes each row bit for bit as a one-token pass does, so greedy speculative
output equals plain decoding and sampled output is distributed exactly as the target's. The
fast default mode keeps the stock kernels (cuBLAS, SDPA), whose rows may differ by rounding
between a 1-row and a (γ+1)-row pass; the device probe measures how often that changes a token.
See :mod:`specchat.kernels.invariant` for the kernels and their tests.
"""

from __future__ import annotations

from torch import nn

from specchat.engine import sampling
from specchat.errors import InvalidSettingError
from specchat.kernels import invariant

MODES = ("fast", "exact")


def use_exact_kernels(*models: nn.Module) -> dict[str, int]:
    """Switch ``models`` (target and draft) and the sampling softmax to the invariant kernels."""
    problem = invariant.available()
    if problem is not None:
        raise InvalidSettingError(f"exact mode cannot run here: {problem}")
    counts: dict[str, int] = {}
    for model in models:
        for kind, count in invariant.apply(model).items():
            counts[kind] = counts.get(kind, 0) + count
    sampling.use_cuda_softmax(invariant.softmax)
    return counts
