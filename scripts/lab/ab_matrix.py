"""Interleaved A/B of kernel builds on one kind of the real target's matrices, cold and cache-hot.

    python scripts/lab/ab_matrix.py PACKED_FOLDER NAME=SOURCE.cpp [NAME=SOURCE.cpp ...]

Each SOURCE is built as its own extension (as scripts/lab/ab_kernels.py builds it) and times a
product of the matrix named by MATRIX (default ``gate``) with M random rows (M from ROWS,
default 1,2,4,8): "hot" repeats layer 0's matrix, so it stays in cache and the figure is the
kernel's arithmetic; "cold" cycles through every layer's matrix, so the weights stream from
memory as in decoding. Builds alternate rep by rep; each figure is the median of 6 reps of 56
products, with the bytes of layer 0's matrix per second. The lab notebook's kernel lever notes
(docs/lab/2026-12-01-kernel-levers.md) were made with it.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

sys.path.insert(0, str(Path(__file__).parent))
import ab_kernels  # a sibling script, not a package

FIELDS = ("q", "sc", "mn", "d", "dm")


def matrices(module: Any, handle: Any, meta: dict[str, Any], name: str) -> list[Any]:
    make = ab_kernels.qmat_with(module)
    out = []
    for layer in range(meta["shape"]["layers"]):
        key = f"layers.{layer}.{name}"
        info = meta["matrices"][key]
        tensors = {f: handle.get_tensor(f"{key}.{f}") for f in FIELDS if f"{key}.{f}" in handle.keys()}  # noqa: SIM118
        out.append(make(info["kind"], tensors, info["super_block"], info["offset"], info["rows"], None))
    return out


def timed(products: list[Any], x: torch.Tensor, cycle: bool, count: int = 56) -> float:
    started = time.perf_counter()
    for i in range(count):
        products[i % len(products) if cycle else 0].forward(x)
    return (time.perf_counter() - started) / count


def main(argv: list[str]) -> None:
    if len(argv) < 2:
        raise SystemExit(__doc__)
    folder, specs = Path(argv[0]), argv[1:]
    name = os.environ.get("MATRIX", "gate")
    torch.set_num_threads(int(os.environ.get("SPECCHAT_THREADS", "2")))
    handle = safe_open(str(folder / "weights.safetensors"), framework="pt")
    meta = json.loads(handle.metadata()["specchat"])
    workdir = Path(tempfile.mkdtemp())
    builds = {}
    for spec in specs:
        label, _, source = spec.partition("=")
        variant = ab_kernels.Variant(label, Path(source), folder, False)
        builds[label] = matrices(ab_kernels.build(variant, workdir), handle, meta, name)
    first = f"layers.0.{name}"
    nbytes = sum(handle.get_tensor(f"{first}.{f}").nbytes for f in FIELDS if f"{first}.{f}" in handle.keys())  # noqa: SIM118
    K = next(iter(builds.values()))[0].K
    print(f"{name}: {nbytes / 1e6:.2f} MB per matrix, K {K}; load {os.getloadavg()}", flush=True)
    for rows in (int(r) for r in os.environ.get("ROWS", "1,2,4,8").split(",")):
        x = torch.randn(rows, K)
        times: dict[str, dict[str, list[float]]] = {b: {"hot": [], "cold": []} for b in builds}
        for rep in range(6):
            for label in builds if rep % 2 == 0 else reversed(list(builds)):
                times[label]["hot"].append(timed(builds[label], x, cycle=False))
                times[label]["cold"].append(timed(builds[label], x, cycle=True))
        cells = []
        for label, t in times.items():
            hot, cold = statistics.median(t["hot"]), statistics.median(t["cold"])
            cells.append(
                f"{label} hot {hot * 1e3:.3f} ms ({nbytes / hot / 1e9:.1f} GB/s) "
                f"cold {cold * 1e3:.3f} ms ({nbytes / cold / 1e9:.1f} GB/s)"
            )
        print(f"M={rows}: " + "  ".join(cells), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
