"""Where a pass of the packed target spends its time: perf samples of passes of one width, by part.

    python scripts/lab/pass_profile.py PACKED_FOLDER VARIANT WIDTH [PASSES]

Loads the packed model on the kernel variant VARIANT (avx512, avxvnni-evex, avx2, ...), prefills
100 tokens, then attaches `perf record` to this process and runs PASSES passes of WIDTH new
positions (each with every row's logits, as a verify pass), rolled back after each, on one
thread. Prints the CPU time per pass and the share of perf's samples by part: each block kernel,
attention, the rest of the decoder, Python (and its garbage collector), the C library and torch.
Needs `perf` (kernel.perf_event_paranoid <= 2 for a process's own user-space samples); the
samples are cpu-clock ones, so any VM can take them. Time it with the machine otherwise idle.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import torch

from specchat.kernels import ISA_ENV

PREFILL = 100
PARTS = (
    # (part, pattern on "dso symbol"), first match wins
    ("q4/q5 kernel", r"nibble_block<"),
    ("q6 kernel", r"q6_block<"),
    ("q8 kernel", r"q8_block<"),
    ("float kernels", r"f(16|32)_block<|float_block<"),
    ("run_group's block loop", r"run_group\(.*lambda"),
    ("attention", r"Decoder::attend"),
    ("decoder, row quantization", r"specchat_qgemm"),
    ("Python: garbage collector", r"libpython.*(gc_collect|visit_decref|visit_reachable|_traverse)"),
    ("Python: the rest", r"libpython"),
    ("libc, torch, kernel", r"."),
)


def part_of(line: str) -> str:
    return next(name for name, pattern in PARTS if re.search(pattern, line))


def shares(data: Path) -> dict[str, float]:
    report = subprocess.run(
        ["perf", "report", "-i", str(data), "--no-children", "--sort", "dso,symbol", "--stdio"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    totals: dict[str, float] = defaultdict(float)
    for line in report.stdout.splitlines():
        found = re.match(r"\s*([\d.]+)%\s+(.*)", line)
        if found and not line.startswith("#"):
            totals[part_of(found.group(2))] += float(found.group(1))
    return totals


def main(argv: list[str]) -> None:
    if len(argv) < 3:
        raise SystemExit(__doc__)
    folder, variant, width = Path(argv[0]), argv[1], int(argv[2])
    passes = int(argv[3]) if len(argv) > 3 else 20
    os.environ[ISA_ENV] = variant
    torch.set_num_threads(1)
    from specchat.models.compute.packed_cache import load_packed

    model, _ = load_packed(folder, folder.name)
    ids = (torch.arange(PREFILL + width) % 32 + 1)[None]  # any ids: a small model's vocabulary too
    cache = model(ids[:, :PREFILL], None, logits_to_keep=1).cache
    with tempfile.TemporaryDirectory() as work:
        data = Path(work) / "perf.data"
        perf = subprocess.Popen(
            ["perf", "record", "-F", "2000", "-p", str(os.getpid()), "-o", str(data)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        time.sleep(1.0)  # perf attaches
        started = time.thread_time()
        for _ in range(passes):
            model(ids[:, PREFILL : PREFILL + width], cache, logits_to_keep=width)
            cache.crop(PREFILL)
        per_pass = (time.thread_time() - started) / passes
        perf.send_signal(signal.SIGINT)
        perf.wait()
        totals = shares(data)
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"{folder.name} on {variant}, width {width}: {per_pass * 1e3:.1f} ms CPU a pass, 1 thread")
    print(f"  load {load}; share of the samples:")
    for name, _ in PARTS:
        print(f"  {name:<28} {totals.get(name, 0.0):5.1f} %")


if __name__ == "__main__":
    main(sys.argv[1:])
