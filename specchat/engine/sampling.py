"""Pure functions from logits to tokens: distribution shaping, the acceptance test, the residual.

Names follow the paper: ``p_target`` is the target's distribution, ``p_draft`` the one the
draft actually sampled from. Both are shaped by the *same* temperature / top-k / top-p, which
is what keeps speculative sampling exact: the reply is distributed as the shaped target alone.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from specchat.params import SamplingParams

__all__ = ["SamplingParams"]  # re-exported: the engine's callers import it from here too


def shape_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Rows of logits → rows of probabilities (float32) after temperature, top-k and top-p.

    At temperature 0 the decision is argmax; the plain softmax is returned so that events can
    still report how confident each model was.
    """
    logits = logits.float()
    if params.greedy:
        return row_softmax(logits)
    logits = logits / params.temperature
    if params.top_k is not None and params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = row_softmax(logits)
    if params.top_p < 1.0:
        probs = _keep_top_p(probs, params.top_p)
    return probs


Softmax = Callable[[torch.Tensor], torch.Tensor]
_cuda_softmax: Softmax | None = None


def use_cuda_softmax(softmax: Softmax | None) -> None:
    """Rows on CUDA go through ``softmax`` (a batch-invariant kernel: exact mode), or torch's (None)."""
    global _cuda_softmax
    _cuda_softmax = softmax


def row_softmax(logits: torch.Tensor) -> torch.Tensor:
    """Softmax over each row, computed the same way whether the pass had 1 row or γ+1."""
    if _cuda_softmax is not None and logits.device.type == "cuda":
        return _cuda_softmax(logits)
    return torch.softmax(logits, dim=-1)


def _keep_top_p(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose mass reaches top_p, renormalised."""
    sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
    mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
    sorted_probs = sorted_probs.masked_fill(mass_before >= top_p, 0.0)
    kept = torch.zeros_like(probs).scatter_(-1, order, sorted_probs)
    return kept / kept.sum(dim=-1, keepdim=True)


DRAW_BLOCK = 1024
"""Tokens per block of :func:`draw_rows`'s two-level running sum."""


def pick_tokens(
    probs: torch.Tensor, params: SamplingParams, generator: torch.Generator | None
) -> torch.Tensor:
    """One token per row: argmax when greedy, else a draw from the row's distribution."""
    if params.greedy:
        return argmax_rows(probs)
    return draw_rows(probs, generator)


def argmax_rows(scores: torch.Tensor) -> torch.Tensor:
    """Each row's most likely token (the first of equals), as torch.argmax picks it.

    On the CPU through numpy, whose argmax is vectorised: torch's walks a 150k-token row an
    element at a time, and plain decoding and every round pay for it. One rule for both loops,
    so greedy speculative output stays identical to plain decoding.
    """
    if not _numpy_reads(scores):
        return scores.argmax(dim=-1)
    return torch.from_numpy(np.asarray(scores.numpy().argmax(axis=-1), dtype=np.int64))


def _numpy_reads(tensor: torch.Tensor) -> bool:
    """Whether numpy can view the tensor in place (a CPU tensor of a dtype numpy has)."""
    return tensor.device.type == "cpu" and tensor.dtype != torch.bfloat16


TOP_CHUNK = 1024
"""Entries per chunk whose maxima bound a row's k-th largest entry in :func:`top_entries`."""
TOP_CANDIDATES = 4096
"""More entries than this at or above that bound (a row of many equal values): torch.topk."""


def top_entries(row: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The k largest entries of a 1-D row and their indices, largest first.

    Equal entries come lower index first, except where torch.topk ranks them (on the GPU, short
    rows, and rows with many entries at the floor below).

    On the CPU, the maxima of k chunks are k distinct entries, so the k-th largest chunk maximum
    is a floor for the row's k-th largest entry: only the few entries above it are sorted. The
    inspector ranks one row per round this way, a fraction of what torch.topk costs there.
    """
    k = min(k, row.shape[0])
    if not _numpy_reads(row) or row.shape[0] < TOP_CHUNK * k:
        top = torch.topk(row, k)
        return top.values, top.indices
    values = row.numpy()
    whole = values.shape[0] // TOP_CHUNK * TOP_CHUNK
    chunk_max = values[:whole].reshape(-1, TOP_CHUNK).max(axis=1)
    floor = np.partition(chunk_max, -k)[-k]
    candidates = np.flatnonzero(values >= floor)
    if candidates.shape[0] > TOP_CANDIDATES or candidates.shape[0] < k:  # many equals, or NaNs
        top = torch.topk(row, k)
        return top.values, top.indices
    order = np.lexsort((candidates, -values[candidates]))[:k]
    ids = candidates[order]
    return torch.from_numpy(values[ids].copy()), torch.from_numpy(ids.astype(np.int64))


def draw_rows(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One draw per row of (unnormalised) probabilities, by inverting the row's running sum.

    Exact like torch.multinomial and, on the CPU, an order of magnitude faster over a 150k-token
    vocabulary (multinomial costs milliseconds per row there). The running sum is taken in two
    levels, in float64: over blocks of the row, then within the block the uniform falls in, so
    rounding cannot move mass between tokens, and only one block's sum runs serially. A
    zero-probability token is never drawn: no uniform falls between two equal running sums.
    """
    rows, width = probs.shape
    blocks = -(-width // DRAW_BLOCK)
    padded = torch.nn.functional.pad(probs, (0, blocks * DRAW_BLOCK - width)).view(rows, blocks, DRAW_BLOCK)
    block_cdf = torch.cumsum(padded.sum(-1, dtype=torch.float64), dim=-1)
    total = block_cdf[:, -1:].contiguous()
    u = torch.rand(rows, 1, generator=generator, dtype=torch.float64, device=probs.device) * total
    # u < total in exact arithmetic; should rounding give u == total, the last block (or token)
    # of positive mass is taken rather than running off the end.
    block = torch.minimum(torch.searchsorted(block_cdf, u, right=True), torch.searchsorted(block_cdf, total))
    before = torch.where(block > 0, block_cdf.gather(1, (block - 1).clamp(min=0)), torch.zeros_like(u))
    inner = padded.gather(1, block[:, :, None].expand(rows, 1, DRAW_BLOCK)).squeeze(1)
    inner_cdf = torch.cumsum(inner, dim=-1, dtype=torch.float64)
    offset = torch.minimum(
        torch.searchsorted(inner_cdf, u - before, right=True),
        torch.searchsorted(inner_cdf, inner_cdf[:, -1:].contiguous()),
    )
    return (block * DRAW_BLOCK + offset).squeeze(-1)


def own_probabilities(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """softmax(logits row i)[tokens[i]] for each token: temperature 1, no top-k, no top-p.

    What a model itself thought of each drafted token, for the trace only (never for a
    decision). One logsumexp per row over logits already at hand; an id past the rows' width
    (a draft vocabulary wider than the target's) has probability 0.
    """
    rows = logits[: tokens.shape[0]].float()
    width = rows.shape[-1]
    picked = rows.gather(-1, tokens.clamp(max=width - 1)[:, None]).squeeze(-1)
    own = torch.exp(picked - torch.logsumexp(rows, dim=-1))
    return torch.where(tokens < width, own, torch.zeros_like(own))


def acceptance_probability(p_target: torch.Tensor, p_draft: torch.Tensor) -> torch.Tensor:
    """min(1, p_target(x) / p_draft(x)) for the drafted token x (elementwise)."""
    return torch.clamp(p_target / p_draft, max=1.0)


def residual_distribution(p_target: torch.Tensor, p_draft: torch.Tensor) -> torch.Tensor:
    """norm(max(p_target − p_draft, 0)) row by row.

    A rejection is only possible where p_draft exceeds p_target somewhere, and then the
    residual has exactly that much mass. A row that sums to zero (the two distributions are
    equal up to rounding, so a rejection had probability ~0) falls back to p_target, which is
    what the rejection-sampling identity converges to in that limit.
    """
    residual = torch.clamp(p_target - p_draft, min=0.0)
    mass = residual.sum(dim=-1, keepdim=True)
    return torch.where(mass > 0, residual / mass.clamp(min=torch.finfo(residual.dtype).tiny), p_target)


@dataclass(frozen=True, slots=True)
class RoundVerification:
    """Outcome of verifying one round of drafts against the target, with its full trace.

    Named apart from :data:`specchat.engine.events.Verdict`, one drafted token's fate in an event;
    this is the whole round as the device computed it, before it becomes events."""

    accepted: int
    next_token: int
    """The correction (accepted < drafted), or the bonus / plain token (accepted == drafted)."""
    p_target_drafts: list[float]
    p_draft_drafts: list[float]
    accept_probs: list[float]
    """min(1, p_target / p_draft) of each draft, as the device computed it."""
    draws: list[float] | None
    """The uniform draw of each draft's test; None when greedy (the test is argmax equality)."""
    p_target_next: float
    top_ids: list[int]
    """The most likely tokens of the distribution the closing token was drawn from."""
    top_probs: list[float]
    p_target_own: list[float] | None = None
    """The target's own softmax (temperature 1, unshaped) of each draft; None when not asked."""
    draft_ids: list[int] | None = None
    """The drafted ids, read back with the verdict when they stayed on the device (see ``count``)."""

    @property
    def from_residual(self) -> bool:
        """Whether the closing token was drawn from the residual (a rejection at T > 0)."""
        return self.draws is not None and self.accepted < len(self.draws)


def verify(
    p_target: torch.Tensor,
    p_draft: torch.Tensor,
    drafts: torch.Tensor,
    params: SamplingParams,
    generator: torch.Generator | None,
    top_k: int = 5,
    p_target_own: torch.Tensor | None = None,
    count: torch.Tensor | None = None,
) -> RoundVerification:
    """Accept a prefix of ``drafts`` and choose the round's closing token.

    p_target: [γ+1, V] shaped target rows (row i scores the token after i drafts).
    p_draft:  [γ, V] the distributions the drafts were sampled from (one-hot for lookups).
    drafts:   [γ] drafted token ids.

    Every candidate closing token (a residual draw for each row that could reject, and a
    bonus draw from the last row), the top ``top_k`` of each candidate's distribution and the
    decisions are computed on the device and read back together, so a round (trace included)
    costs a single host synchronisation.

    p_target_own: [γ] the target's own softmax of each draft (:func:`own_probabilities`), read
    back in the same synchronisation for the trace. At T = 0 it is not needed: the greedy rows
    of ``p_target`` are the plain softmax already (:func:`shape_probs`).

    count: for drafts that stayed on the device, a 0-dim tensor n ≤ γ: only the first n drafts
    are proposed (the draft's stop rule, applied on the device), the rest are ignored. Row n then
    closes the round from ``p_target`` itself (the bonus), as if only n had been drafted; the
    drafted ids come back with the verdict (``draft_ids``, n of them).
    """
    if drafts.shape[0] == 0 and count is None:
        return _verify_nothing(p_target, params, generator, top_k, own_asked=p_target_own is not None)
    return _verify_drafts(p_target, p_draft, drafts, params, generator, top_k, p_target_own, count)


def _verify_nothing(
    p_target: torch.Tensor,
    params: SamplingParams,
    generator: torch.Generator | None,
    top_k: int,
    *,
    own_asked: bool,
) -> RoundVerification:
    """What :func:`_verify_drafts` gives for an empty draft, as cheaply as a plain step.

    A round the schedule decodes plainly closes with the token plain decoding picks from the
    target's one row (the same draw from the same generator), its probability and the row's top
    entries, in one host read. Through the general path the empty draft's bookkeeping cost about
    as much as the step's sampling again, at every plain round of a reply
    (docs/lab/2026-12-05-plain-rounds.md).
    """
    row = p_target[:1]
    token = pick_tokens(row, params, generator)
    top_values, top_ids = top_entries(row[0], top_k)
    parts = [token, row[0, token], top_ids, top_values]
    packed = torch.cat([part.double() for part in parts]).tolist()
    width = top_ids.shape[0]
    return RoundVerification(
        accepted=0,
        next_token=int(packed[0]),
        p_target_drafts=[],
        p_draft_drafts=[],
        accept_probs=[],
        draws=None if params.greedy else [],
        p_target_next=packed[1],
        top_ids=[int(i) for i in packed[2 : 2 + width]],
        top_probs=packed[2 + width :],
        p_target_own=[] if params.greedy or own_asked else None,
    )


def _verify_drafts(
    p_target: torch.Tensor,
    p_draft: torch.Tensor,
    drafts: torch.Tensor,
    params: SamplingParams,
    generator: torch.Generator | None,
    top_k: int,
    p_target_own: torch.Tensor | None,
    count: torch.Tensor | None,
) -> RoundVerification:
    gamma = drafts.shape[0]
    device = drafts.device
    rows = torch.arange(gamma, device=device)
    pt_drafts = p_target[rows, drafts]
    pd_drafts = p_draft[rows, drafts]
    accept_probs = acceptance_probability(pt_drafts, pd_drafts)
    all_rows = torch.arange(gamma + 1, device=device)
    proposed = rows < count if count is not None else None
    if params.greedy:
        argmax = argmax_rows(p_target)
        accept = argmax[:gamma] == drafts
        candidates = argmax
        sources = p_target
        draws = torch.zeros(0, device=device)
    else:
        draws = torch.rand(gamma, generator=generator, device=device)
        accept = draws < accept_probs
        sources = torch.cat([residual_distribution(p_target[:gamma], p_draft), p_target[gamma:]])
        if count is not None:  # the row after the last proposed draft is a bonus row, not a residual
            sources = torch.where((all_rows < count)[:, None], sources, p_target)
        candidates = pick_tokens(sources, params, generator)
    if proposed is not None:
        accept = accept & proposed
    pt_candidates = p_target[all_rows, candidates]
    # The closing row (the first rejection, or the bonus row) is found on the device, so only its
    # distribution is ranked: one row's top-k, not γ+1 of them. index_select, not sources[row]:
    # indexing by a 0-dim device tensor would read it back to the host.
    closing_row = accept.long().cumprod(0).sum()
    top_values, top_ids = top_entries(sources.index_select(0, closing_row.reshape(1))[0], top_k)
    if params.greedy:
        p_target_own = pt_drafts
    own = p_target_own if p_target_own is not None else torch.zeros(0, device=device)
    extra = [drafts, count.reshape(1)] if count is not None else []
    parts = [
        accept,
        candidates,
        pt_drafts,
        pd_drafts,
        accept_probs,
        pt_candidates,
        draws,
        top_ids,
        top_values,
        own,
        *extra,
    ]
    packed = torch.cat([part.double() for part in parts]).tolist()
    width = top_ids.shape[0]
    sizes = [gamma, gamma + 1, gamma, gamma, gamma, gamma + 1, draws.shape[0], width, width, own.shape[0]]
    sizes += [gamma, 1] if count is not None else []
    flags, cand, pt_d, pd_d, acc_p, p_cand, u, top_read, top_probs, pt_own, *ids_read = _split(packed, sizes)
    n = int(ids_read[1][0]) if count is not None else gamma
    accepted = next((i for i, ok in enumerate(flags[:n]) if not ok), n)
    return RoundVerification(
        accepted=accepted,
        next_token=int(cand[accepted]),
        p_target_drafts=pt_d[:n],
        p_draft_drafts=pd_d[:n],
        accept_probs=acc_p[:n],
        draws=None if params.greedy else u[:n],
        p_target_next=p_cand[accepted],
        top_ids=[int(i) for i in top_read],
        top_probs=top_probs,
        p_target_own=pt_own[:n] if p_target_own is not None else None,
        draft_ids=[int(i) for i in ids_read[0]] if count is not None else None,
    )


def _split(values: list[float], sizes: list[int]) -> list[list[float]]:
    out, start = [], 0
    for size in sizes:
        out.append(values[start : start + size])
        start += size
    return out
