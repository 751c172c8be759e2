"""Are two builds of the CPU kernels the same function? Logits compared bit for bit, in one process.

    python scripts/lab/same_logits.py A.cpp B.cpp PACKED_FOLDER

Both sources are built side by side (as scripts/lab/ab_kernels.py builds them), both load the packed
model in PACKED_FOLDER and prefill the same 100 tokens; then passes of width 1–9 and 17 over the
same random ids are compared with torch.equal. A kernel change that only reorders exact integer
sums, or how weights are fetched, must print "all identical": then greedy decoding, and the
greedy-equality counts in docs/performance.md, are unchanged by it. Exit status 1 when any width differs.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parent))
import ab_kernels  # a sibling script, not a package

WIDTHS = (1, 2, 3, 4, 5, 6, 7, 8, 9, 17)


def logits_of(variant: ab_kernels.Variant, ids: torch.Tensor) -> torch.Tensor:
    out: Any = variant.model(ids, variant.cache, logits_to_keep=ids.shape[1])
    variant.cache.crop(ab_kernels.PREFILL)
    return out.logits if hasattr(out, "logits") else out


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        raise SystemExit(__doc__)
    torch.set_num_threads(2)
    workdir = Path(tempfile.mkdtemp())
    builds = [
        ab_kernels.parse(f"{name}={source}:{argv[2]}") for name, source in zip("ab", argv[:2], strict=True)
    ]
    keep: list[Any] = []
    for variant in builds:
        ab_kernels.load(variant, workdir, keep)
    generator = torch.Generator().manual_seed(1)
    differing = 0
    for width in WIDTHS:
        ids = torch.randint(0, 150000, (1, width), generator=generator)
        a, b = (logits_of(v, ids) for v in builds)
        same = torch.equal(a, b)
        differing += not same
        gap = "identical" if same else f"DIFFERENT (max {(a - b).abs().max().item():.3g})"
        print(f"width {width}: {gap}")
    print("all identical" if not differing else f"{differing} widths differ")
    return 1 if differing else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
