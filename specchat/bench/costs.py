"""Measuring the cost model's inputs on the loaded pair: c and v(γ).

c is one draft forward pass over one target forward pass, both for a single new token;
v(γ) is a target pass over γ+1 new positions (a verify pass) over a single-token pass. Both are
timed on the models' own caches after a real prompt, so they include everything a decoding
step pays for a forward pass (kernel launches, Python, the cache update), and nothing else.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from statistics import median

from specchat.engine.costs import interpolate_verify_ms
from specchat.engine.kv import CachedLM, device_sync


@dataclass(frozen=True)
class Costs:
    target_ms: float
    """One target forward pass over one new token (milliseconds, median)."""
    draft_ms: float | None
    """The same for the draft model (None without one)."""
    verify_ms: dict[int, float] = field(default_factory=dict)
    """γ → a target pass over γ+1 new positions."""
    context_tokens: int = 0

    @property
    def c(self) -> float | None:
        return self.draft_ms / self.target_ms if self.draft_ms is not None else None

    def v(self, gamma: int) -> float:
        """v(γ); widths not measured come from the engine's one interpolation (v(0) = 1)."""
        if gamma <= 0:
            return 1.0
        verify_ms = interpolate_verify_ms({0: self.target_ms, **self.verify_ms}, gamma)
        assert verify_ms is not None  # the plain step is always a point
        return verify_ms / self.target_ms

    def to_json(self) -> dict[str, object]:
        return {
            "target_ms": round(self.target_ms, 3),
            "draft_ms": round(self.draft_ms, 3) if self.draft_ms is not None else None,
            "c": round(self.c, 4) if self.c is not None else None,
            "verify_ms": {str(g): round(ms, 3) for g, ms in sorted(self.verify_ms.items())},
            "v": {str(g): round(self.v(g), 4) for g in sorted(self.verify_ms)},
            "context_tokens": self.context_tokens,
        }


def time_pass(lm: CachedLM, context: list[int], new: list[int]) -> float:
    """Milliseconds for one forward pass over ``new`` after a cached ``context``."""
    device_sync(lm.device)
    start = time.perf_counter()
    lm.logits_after(context + new, len(new))  # n_logits = len(new): the context is reused, new runs
    device_sync(lm.device)
    return (time.perf_counter() - start) * 1000.0


def measure_costs(
    target: CachedLM,
    draft: CachedLM | None,
    ids: Sequence[int],
    gammas: Sequence[int],
    *,
    repeats: int = 5,
) -> Costs:
    """Median timings after ``ids`` (a real prompt): the models' caches are left holding it."""
    width = max([*gammas, 1]) + 1
    if len(ids) < width + 2:
        raise ValueError(f"the cost probe needs a context of at least {width + 2} tokens")
    context, tail = list(ids[:-width]), list(ids[-width:])

    # Interleave the widths rep by rep, so that a burst of load elsewhere hits all of them alike.
    jobs: list[tuple[str, CachedLM, int]] = [("target", target, 1)]
    if draft is not None:
        jobs.append(("draft", draft, 1))
    jobs += [(f"verify{g}", target, g + 1) for g in sorted(set(gammas)) if g >= 1]
    for _, lm, k in jobs:
        lm.logits_after(context, 1)  # cache the context
        time_pass(lm, context, tail[:k])  # warm this width
    samples: dict[str, list[float]] = {name: [] for name, _, _ in jobs}
    for _ in range(repeats):
        for name, lm, k in jobs:
            samples[name].append(time_pass(lm, context, tail[:k]))
    verify = {int(name[6:]): median(v) for name, v in samples.items() if name.startswith("verify")}
    draft_ms = median(samples["draft"]) if draft is not None else None
    return Costs(median(samples["target"]), draft_ms, verify, context_tokens=len(context))
