"""What a pass of each width costs on a packed model: the flat part of the verify curve.

    python scripts/lab/pass_widths.py PACKED_FOLDER [PREFIX] [REPS] [HEAD_ROWS]

Loads a folder of the packed cache (``specchat models`` lists them), prefills PREFIX random
tokens (default 100), then times single passes of 1 to 8 new positions with logits for all of
them (what a verify pass asks), REPS times each (default 15), widths interleaved and their order
reversed every other repetition, the cache cropped back after each pass. Prints each width's
median in ms and its ratio to one position. HEAD_ROWS computes only the first ids of the head (a
draft's narrow head). 2 threads unless SPECCHAT_THREADS says otherwise.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
from safetensors import safe_open
from transformers import AutoConfig

from specchat.kernels.native import PackedModel, native_model

WIDTHS = range(1, 9)


def main(argv: list[str]) -> None:
    if not argv:
        raise SystemExit(__doc__)
    folder = Path(argv[0]).expanduser()
    prefix = int(argv[1]) if len(argv) > 1 else 100
    reps = int(argv[2]) if len(argv) > 2 else 15
    head_rows = int(argv[3]) if len(argv) > 3 else 0
    torch.set_num_threads(int(os.environ.get("SPECCHAT_THREADS", "2")))
    with safe_open(str(folder / "weights.safetensors"), framework="pt") as handle:
        meta = json.loads(handle.metadata()["specchat"])
        tensors = {key: handle.get_tensor(key) for key in handle.keys()}  # noqa: SIM118
    model = native_model(PackedModel.from_meta(meta, tensors), AutoConfig.from_pretrained(str(folder)))
    cache = model.new_cache()
    model(torch.randint(0, 1000, (1, prefix)), cache, logits_to_keep=1)
    times: dict[int, list[float]] = {w: [] for w in WIDTHS}
    print(f"threads {torch.get_num_threads()}, load before {os.getloadavg()}", flush=True)
    for rep in range(reps):
        for width in WIDTHS if rep % 2 == 0 else reversed(WIDTHS):
            ids = torch.randint(0, 1000, (1, width))
            started = time.perf_counter()
            model(ids, cache, logits_to_keep=width, head_rows=head_rows or None)
            times[width].append(time.perf_counter() - started)
            cache.crop(prefix)
    print(f"load after {os.getloadavg()}")
    one = statistics.median(times[1])
    for width in WIDTHS:
        ms = statistics.median(times[width])
        print(f"width {width}: {ms * 1e3:6.1f} ms  ({ms / one:.2f} of one position)")


if __name__ == "__main__":
    main(sys.argv[1:])
