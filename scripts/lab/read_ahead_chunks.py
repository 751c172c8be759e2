"""What reading a prompt in chunks costs against reading it in one pass (issue 43, reading ahead).

    python scripts/lab/read_ahead_chunks.py PACKED_FOLDER [TOKENS] [CHUNKS] [REPEATS] [THREADS]

Reads TOKENS prompt tokens (default 512) into an empty cache of the packed model, in one pass and
in chunks of each size in CHUNKS (comma-separated, default 16,32,64), the ways taking turns
REPEATS times (default 3) so a drifting machine favours none. Prints each way's median time, its
milliseconds per token and its cost against one pass, and the longest chunk's time (what a reply
starting mid-read waits for at most).
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import torch

from specchat.engine.kv import CachedLM
from specchat.models.compute.packed_cache import load_packed


def read(lm: CachedLM, ids: list[int], chunk: int | None) -> tuple[float, float]:
    """(whole ms, longest chunk ms) reading ids into an empty cache."""
    lm.reset()
    start = time.perf_counter()
    longest = 0.0
    step = chunk or len(ids)
    for end in range(step, len(ids) + step, step):
        t = time.perf_counter()
        lm.logits_after(ids[: min(end, len(ids))], 1)
        longest = max(longest, time.perf_counter() - t)
    return (time.perf_counter() - start) * 1000.0, longest * 1000.0


def main(argv: list[str]) -> None:
    folder = Path(argv[0])
    tokens = int(argv[1]) if len(argv) > 1 else 512
    chunks = [int(c) for c in argv[2].split(",")] if len(argv) > 2 else [16, 32, 64]
    repeats = int(argv[3]) if len(argv) > 3 else 3
    if len(argv) > 4:
        torch.set_num_threads(int(argv[4]))
    model, _ = load_packed(folder, folder.name)
    lm = CachedLM(model)
    ids = [100 + (i * 37) % 20000 for i in range(tokens)]
    ways: list[int | None] = [None, *chunks]
    times: dict[int | None, list[tuple[float, float]]] = {w: [] for w in ways}
    read(lm, ids[:64], None)  # warm
    for _ in range(repeats):
        for way in ways:
            times[way].append(read(lm, ids, way))
    whole = statistics.median(t for t, _ in times[None])
    print(f"{tokens} tokens, {torch.get_num_threads()} threads, {folder.name}")
    for way in ways:
        median = statistics.median(t for t, _ in times[way])
        longest = max(c for _, c in times[way])
        name = "one pass" if way is None else f"chunks of {way}"
        print(
            f"{name:>14}: {median:8.0f} ms  {median / tokens:6.2f} ms/token  "
            f"{median / whole:5.2f}× one pass  longest chunk {longest:6.0f} ms"
        )


if __name__ == "__main__":
    main(sys.argv[1:])
