"""Q6_K at its own 6.5 bits (the q6 kernel) against the same values in the 8.5-bit q8 layout.

    python scripts/lab/ab_q6.py matrix      # bit identity, then cold products by width
    python scripts/lab/ab_q6.py generate    # plain decoding and the defaults, end to end

Before the q6 kernel, the target's Q6_K matrices (its head, half its down and v projections)
were packed in the q8 layout. ``matrix`` checks that q6 computes bit for bit what q8 computes
with the same values, on random Q6_K-range matrices at widths 1-13, then times cold products of
a down-shaped (1536×8960, 8 copies) and a head-shaped matrix (37984×1536, 2 copies), q8 and q6
alternating rep by rep. ``generate`` loads the default pair twice, once as packed and once with
every q6 matrix expanded to q8 in memory, and runs the bench prompts (2 a category, 128 tokens,
greedy) through plain decoding and the defaults, the two loads alternating prompt by prompt;
every text must be the same in both. Speeds are the bench's: tokens over the wall time less the
target's prefill.
"""

from __future__ import annotations

import collections
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from specchat.kernels.formats import Unpacked
from specchat.kernels.qlinear import QLinear


def six_bit(n: int, k: int, kind: str, seed: int) -> Unpacked:
    rng = np.random.default_rng(seed)
    q = rng.integers(0, 64, (n, k), dtype=np.uint8)
    sc = rng.integers(-128, 128, (n, k // 16)).astype(np.int8)
    d = (rng.random((n, k // 256)) * 1e-3).astype(np.float16)
    return Unpacked(kind, q, sc, d, 256, offset=32)


def matrix_run() -> None:
    shapes = {"down": ((1536, 8960), 8), "head": ((151936 // 4, 1536), 2)}
    mats = {
        name: [
            {kind: QLinear(six_bit(*shape, kind, seed)) for kind in ("q8", "q6")} for seed in range(copies)
        ]
        for name, (shape, copies) in shapes.items()
    }
    for name, ((_, k), _) in shapes.items():
        for width in (1, 2, 3, 4, 5, 8, 13):
            x = torch.randn(width, k)
            if not torch.equal(mats[name][0]["q8"](x), mats[name][0]["q6"](x)):
                raise SystemExit(f"q6 differs from q8 on {name} at width {width}")
    print("q6 = q8 bit for bit at widths 1, 2, 3, 4, 5, 8, 13", flush=True)
    widths = (1, 2, 3, 4, 5, 6, 8)
    times: dict[tuple[str, str, int], list[float]] = collections.defaultdict(list)
    xs = {(name, w): torch.randn(w, shape[1]) for name, (shape, _) in shapes.items() for w in widths}
    with torch.inference_mode():
        for rep in range(int(os.environ.get("REPS", "12"))):
            for name in shapes:
                for width in widths:
                    for kind in ("q8", "q6") if rep % 2 == 0 else ("q6", "q8"):
                        start = time.perf_counter()
                        for copy in mats[name]:
                            copy[kind](xs[(name, width)])
                        times[(name, kind, width)].append(
                            (time.perf_counter() - start) / len(mats[name]) * 1e3
                        )
    print("load", os.getloadavg(), "threads", torch.get_num_threads())
    for name in shapes:
        median = {
            (kind, w): statistics.median(times[(name, kind, w)]) for kind in ("q8", "q6") for w in widths
        }
        for kind in ("q8", "q6"):
            print(f"{name} {kind} ms", " ".join(f"{w}:{median[(kind, w)]:.3f}" for w in widths))
        print(f"{name} q6/q8  ", " ".join(f"{w}:{median[('q6', w)] / median[('q8', w)]:.2f}" for w in widths))


def as_q8(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A q6 matrix's tensors in the q8 layout (the same values, one byte each)."""
    whole, nibbles = tensors["q"].numpy(), tensors["qh"].numpy()  # [B, K/32, 4, 64], [B, K/32, 2, 64]
    low = np.stack([(nibbles[:, :, j // 2] >> (4 * (j % 2))) & 0x0F for j in range(4)], axis=2)
    halves = np.stack([whole & 0x3F, ((whole >> 6) << 4) | low], axis=2)  # [B, K/32, half, 4, 64]
    blocks, groups = whole.shape[:2]
    q = torch.from_numpy(np.ascontiguousarray(halves).reshape(blocks, 2 * groups, 4, 64))
    return {"q": q, "sc": tensors["sc"], "d": tensors["d"]}


def generate_run() -> None:
    import specchat.kernels.native as native
    from specchat.bench.prompts import load_prompts
    from specchat.engine.backend import Controls
    from specchat.engine.events import SummaryEvent, TokenEvent
    from specchat.engine.session import ChatEngine
    from specchat.models.loading.loader import load_for_decoding

    packed_make = native.qmat_from_tensors

    def expanded(
        kind: str,
        tensors: dict[str, torch.Tensor],
        sb: int,
        offset: int,
        rows: int,
        bias: torch.Tensor | None,
    ) -> Any:
        if kind == "q6":
            return packed_make("q8", as_q8(tensors), sb, offset, rows, bias)
        return packed_make(kind, tensors, sb, offset, rows, bias)

    engines = {}
    factories: dict[str, Callable[..., Any]] = {"q8": expanded, "q6": packed_make}
    for variant, factory in factories.items():
        native.qmat_from_tensors = factory
        pair = load_for_decoding("qwen-coder-1.5b", "qwen-coder-0.5b", cpu_path="auto")
        engines[variant] = ChatEngine(pair.target, pair.tokenizer, pair.draft)
    native.qmat_from_tensors = packed_make
    modes: dict[str, dict[str, Any]] = {
        "plain": {"drafter": "none", "schedule": "fixed"},
        "defaults": {"drafter": "hybrid", "schedule": "adaptive"},
    }
    spent: dict[tuple[str, str], list[tuple[int, float]]] = collections.defaultdict(list)
    texts: dict[tuple[str, str], list[int]] = {}
    prompts = load_prompts(per_category=2)
    print("load", os.getloadavg(), "threads", torch.get_num_threads(), flush=True)
    for i, prompt in enumerate([prompts[0], *prompts]):  # the first one warms both up, untimed
        for mode, options in modes.items():
            for variant in ("q8", "q6") if i % 2 == 0 else ("q6", "q8"):
                engine = engines[variant]
                assert engine.draft is not None
                engine.target.reset()
                engine.draft.reset()
                tokens: list[int] = []
                start = time.perf_counter()
                controls = Controls(gamma=4, max_new_tokens=128, **options)
                for event in engine.stream_ids(engine.prompt_ids(prompt.messages), controls):
                    if isinstance(event, TokenEvent):
                        tokens.append(event.token_id)
                    elif isinstance(event, SummaryEvent):
                        summary = event
                wall = time.perf_counter() - start - summary.prefill_ms / 1e3
                if texts.setdefault((prompt.id, mode), tokens) != tokens:
                    raise SystemExit(f"the greedy text differs between q8 and q6 on {prompt.id} ({mode})")
                if i:
                    spent[(mode, variant)].append((summary.tokens, wall))
        if i:
            print(
                prompt.id,
                {
                    f"{m} {v}": round(spent[(m, v)][-1][0] / spent[(m, v)][-1][1], 1)
                    for m in modes
                    for v in ("q8", "q6")
                },
                flush=True,
            )
    print("load", os.getloadavg())
    for mode in modes:
        rate = {
            v: sum(t for t, _ in spent[(mode, v)]) / sum(s for _, s in spent[(mode, v)]) for v in ("q8", "q6")
        }
        change = rate["q6"] / rate["q8"] - 1
        print(f"{mode}: q8 {rate['q8']:.2f} tok/s, q6 {rate['q6']:.2f} tok/s ({change:+.1%})")


if __name__ == "__main__":
    torch.set_num_threads(int(os.environ.get("THREADS", "2")))
    {"matrix": matrix_run, "generate": generate_run}[sys.argv[1] if len(sys.argv) > 1 else "matrix"]()
