"""Exact mode on CUDA: every pass of the target (and the sampling softmax) on batch-invariant kernels.

A verify pass then computes each row bit for bit as a one-token pass does, so greedy speculative
output equals plain decoding and sampled output is distributed exactly as the target's. The
fast default mode keeps the stock kernels (cuBLAS, SDPA), whose rows may differ by rounding
between a 1-row and a (γ+1)-row pass; the device probe measures how often that changes a token.
See :mod:`specchat.kernels.invariant` for the kernels and their tests.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from specchat.engine import sampling
from specchat.engine.kv import CachedLM
from specchat.errors import InvalidSettingError
from specchat.kernels import invariant
from specchat.models.compute.rows import ROWS_ALONE_FLAG, one_row_at_a_time

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
        counts["rows_alone"] = counts.get("rows_alone", 0) + _rows_alone(model)
    sampling.use_cuda_softmax(invariant.softmax)
    return counts


def _rows_alone(model: nn.Module) -> int:
    """Linear layers whose kernels are not ours (bitsandbytes'): one pass per verify row.

    Exact by construction, at γ+1 of that layer's steps per verify pass: exact mode for a 4-bit
    target trades its speed-up for the guarantee; the default mode keeps such passes batched.
    """
    count = 0
    for module in model.modules():
        is_foreign = isinstance(module, nn.Linear) and type(module) is not nn.Linear
        if is_foreign and not getattr(module, ROWS_ALONE_FLAG, False):
            setattr(module, "forward", one_row_at_a_time(module.forward))  # noqa: B010 (an instance's forward)
            setattr(module, ROWS_ALONE_FLAG, True)
            count += 1
    return count


@dataclass(frozen=True)
class RowAgreement:
    """How a verify pass's rows compare, bit for bit, with one-token passes over the same tokens."""

    rows: int
    differ: int
    """Rows whose logits differ in any bit."""
    argmax_differ: int
    """Rows whose most likely token differs (what changes a greedy reply)."""
    max_abs_diff: float

    def line(self, where: str) -> str:
        if not self.differ:
            return f"verify rows on {where}: all {self.rows} equal one-token passes bit for bit"
        return (
            f"verify rows on {where}: {self.differ}/{self.rows} differ from one-token passes "
            f"(max |Δlogit| {self.max_abs_diff:.3g}; the most likely token changed in {self.argmax_differ})"
        )


@torch.inference_mode()
def row_agreement(lm: CachedLM, ids: list[int], widest: int = 9) -> RowAgreement:
    """Verify passes of widths 2…``widest`` after ``ids[:-widest]`` against one-token passes.

    What exact mode guarantees (0 rows differ) and what the fast default mode may not: the
    self-test reports it on the user's GPU, the device probe on the test machine's.
    """
    if len(ids) < widest + 1:
        raise ValueError(f"row_agreement needs at least {widest + 1} ids")
    context, tail = ids[:-widest], ids[-widest:]
    singles = torch.stack([lm.logits_after(context + tail[: i + 1], 1)[0].float() for i in range(widest)])
    rows = differ = argmax_differ = 0
    worst = 0.0
    for width in range(2, widest + 1):
        batch = lm.logits_after(context + tail[:width], width).float()
        reference = singles[:width]
        differ += int((batch != reference).any(-1).sum())
        argmax_differ += int((batch.argmax(-1) != reference.argmax(-1)).sum())
        worst = max(worst, float((batch - reference).abs().max()))
        rows += width
    return RowAgreement(rows, differ, argmax_differ, worst)
