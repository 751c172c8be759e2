"""One decoding step of a packed model on each kernel variant this CPU runs, interleaved.

    python scripts/lab/variant_speed.py PACKED_FOLDER [STEPS] [WIDTH] [THREADS]

PACKED_FOLDER is a folder of the packed cache (see specchat.models.packed). Every variant runs
the same memory-mapped weights: each prefills the same 32 tokens, then the variants take turns,
one pass of WIDTH new tokens (1: a plain decoding step) each, STEPS times, rolled back after each
pass so every pass sees the same position. Taking turns pass by pass keeps a machine whose speed
drifts (shared cores, memory bandwidth) from favouring whichever variant ran first. Prints each
variant's median pass in ms and the tokens per second that makes, and checks that every variant
gave the same logits. THREADS defaults to torch's (one per core); on cores that other work shares,
one thread is steadier.
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
    from specchat.models.packed import load_packed

    os.environ[ISA_ENV] = name
    model, _ = load_packed(folder, folder.name)
    return model


def main(argv: list[str]) -> None:
    folder = Path(argv[0])
    steps = int(argv[1]) if len(argv) > 1 else 5
    width = int(argv[2]) if len(argv) > 2 else 1
    if len(argv) > 3:
        torch.set_num_threads(int(argv[3]))
    names = runnable_variants()
    models = {name: load_on(name, folder) for name in names}
    prompt = torch.arange(100, 100 + PREFILL + width)[None]
    caches = {}
    for name, model in models.items():
        caches[name] = model(prompt[:, :PREFILL], None, logits_to_keep=1).cache
    times: dict[str, list[float]] = {name: [] for name in names}
    logits: dict[str, torch.Tensor] = {}
    for _ in range(steps):
        for name, model in models.items():
            started = time.perf_counter()
            out = model(prompt[:, PREFILL:], caches[name], logits_to_keep=width)
            times[name].append(time.perf_counter() - started)
            logits[name] = out.logits
            caches[name].crop(PREFILL)
    threads = torch.get_num_threads()
    print(f"{folder.name}: pass of {width} after {PREFILL} tokens, {steps} each, {threads} threads")
    reference = names[-1]
    for name in names:
        median = statistics.median(times[name])
        same = torch.equal(logits[name], logits[reference])
        rate = f"{median * 1000:9.1f} ms  {width / median:7.2f} tokens/s"
        print(f"  {name:<7} {rate}  same logits as {reference}: {same}")


if __name__ == "__main__":
    main(sys.argv[1:])
