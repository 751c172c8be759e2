"""Passes of a packed model on each kernel variant this CPU runs, interleaved.

    python scripts/lab/variant_speed.py PACKED_FOLDER [STEPS] [WIDTHS] [THREADS] [VARIANTS]

PACKED_FOLDER is a folder of the packed cache (see specchat.models.compute.packed_cache). Every variant runs
the same memory-mapped weights: each prefills the same 32 tokens, then the variants take turns,
one pass of WIDTH new tokens (1: a plain decoding step) each, STEPS times per width, rolled back
after each pass so every pass sees the same position. WIDTHS is one width or a comma-separated
list (1,2,4,8): the widths take turns too, and each variant's cost of a pass against its own
pass of the first width, v(w) (with 1 first: against a plain step), is printed beside the
times. Taking turns pass by pass keeps a machine whose speed drifts (shared cores, memory
bandwidth) from favouring whichever variant or width ran first. Prints each variant's median
pass in ms and the tokens per second that makes, and checks that every variant gave the same
logits. THREADS defaults to torch's (one per core); on cores that other work shares, one thread
is steadier. VARIANTS (comma-separated) limits the run to those (default: every variant this CPU
runs, the slow scalar one included).
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

from specchat.kernels import ISA_ENV, VARIANTS, missing_for

PREFILL = 32


def runnable_variants() -> list[str]:
    return [v.name for v in VARIANTS if missing_for(v) is None]


def load_on(name: str, folder: Path) -> Any:
    from specchat.models.compute.packed_cache import load_packed

    os.environ[ISA_ENV] = name
    model, _ = load_packed(folder, folder.name)
    return model


def main(argv: list[str]) -> None:
    folder = Path(argv[0])
    steps = int(argv[1]) if len(argv) > 1 else 5
    widths = [int(w) for w in argv[2].split(",")] if len(argv) > 2 else [1]
    if len(argv) > 3:
        torch.set_num_threads(int(argv[3]))
    here = runnable_variants()
    names = [name for name in argv[4].split(",") if name in here] if len(argv) > 4 else here
    if not names:
        raise SystemExit(f"none of {argv[4]} runs here; this CPU runs {', '.join(here)}")
    models = {name: load_on(name, folder) for name in names}
    widest = max(widths)
    prompt = torch.arange(100, 100 + PREFILL + widest)[None]
    caches = {}
    for name, model in models.items():
        caches[name] = model(prompt[:, :PREFILL], None, logits_to_keep=1).cache
    times: dict[tuple[str, int], list[float]] = {(name, w): [] for name in names for w in widths}
    logits: dict[tuple[str, int], torch.Tensor] = {}
    for _ in range(steps):
        for width in widths:
            for name, model in models.items():
                started = time.perf_counter()
                out = model(prompt[:, PREFILL : PREFILL + width], caches[name], logits_to_keep=width)
                times[name, width].append(time.perf_counter() - started)
                logits[name, width] = out.logits
                caches[name].crop(PREFILL)
    threads = torch.get_num_threads()
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"{folder.name}: passes after {PREFILL} tokens, {steps} each, {threads} threads, load {load}")
    reference = names[-1]
    for width in widths:
        print(f" width {width}")
        for name in names:
            median = statistics.median(times[name, width])
            same = torch.equal(logits[name, width], logits[reference, width])
            rate = f"{median * 1000:9.1f} ms  {width / median:7.2f} tokens/s"
            cost = median / statistics.median(times[name, widths[0]])
            print(f"  {name:<12} {rate}  v({width}) {cost:5.2f}  same logits as {reference}: {same}")


if __name__ == "__main__":
    main(sys.argv[1:])
