"""Instructions the ARM64 kernel builds execute per group, counted under qemu, and the v(w)
estimates docs/performance.md gives from them (there is no ARM hardware here).

    python scripts/lab/arm_counts.py [KINDS] [WIDTHS] [VARIANTS]

KINDS (default 4,6: the default target's q4 and q6), WIDTHS (default 1,2,4,8), VARIANTS (default
neon,i8mm). Builds scripts/lab/instruction_count.cpp against this tree's specchat/kernels with
aarch64-linux-gnu-g++ for each variant and counts its instructions with `qemu-aarch64 -cpu max
-singlestep -d nochain,exec` (one log line per instruction); the differences that program's
header names leave one 64-channel × 1536-input product, 192 groups of 16 channels × 32 inputs.
Exact and independent of load, so one run is enough.

The estimates: where the core is compute-bound, v(w) = I(w)/I(1); where it waits on memory,
v(w) = max(I(w)/3, bytes/B) / max(I(1)/3, bytes/B) with 3 instructions a cycle and B = 2 bytes a
cycle (a group's bytes: q4 296, q5 360, q6 420, q8 548).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROGRAM = ROOT / "scripts/lab/instruction_count.cpp"
FLAGS = {
    "neon": ["-march=armv8.2-a+dotprod", "-DSPECCHAT_ISA_NEON"],
    "i8mm": ["-march=armv8.6-a+i8mm", "-DSPECCHAT_ISA_I8MM"],
}
GROUPS = 192  # 64 channels × 1536 inputs, in groups of 16 channels × 32 inputs
GROUP_BYTES = {4: 296, 5: 360, 6: 420, 8: 548}  # weights, scales and minimums of 16 × 32 inputs
INSTRUCTIONS_A_CYCLE, BYTES_A_CYCLE = 3, 2
APT_PACKAGES = "g++-aarch64-linux-gnu qemu-user"


def build(variant: str, folder: Path) -> Path:
    binary = folder / variant
    subprocess.run(
        ["aarch64-linux-gnu-g++", "-std=c++17", "-O3", "-ffp-contract=off", "-static",
         *FLAGS[variant], f"-I{ROOT / 'specchat/kernels'}", str(PROGRAM), "-o", str(binary)],
        check=True,
    )  # fmt: skip
    return binary


def executed(binary: Path, kind: int, width: int, reps: int, channels: int) -> int:
    log = subprocess.run(
        ["qemu-aarch64", "-cpu", "max", "-singlestep", "-d", "nochain,exec", "-D", "/dev/stdout",
         str(binary), str(kind), str(width), str(reps), str(channels)],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    return sum(1 for line in log.splitlines() if line.startswith("Trace"))


def per_group(binary: Path, kind: int, width: int) -> float:
    runs = [(2, 128), (1, 128), (2, 64), (1, 64)]
    a, b, c, d = (executed(binary, kind, width, reps, channels) for reps, channels in runs)
    return (a - b - c + d) / GROUPS


def memory_bound(instructions: float, kind: int) -> float:
    return max(instructions / INSTRUCTIONS_A_CYCLE, GROUP_BYTES[kind] / BYTES_A_CYCLE)


def main() -> None:
    kinds = [int(k) for k in (sys.argv[1] if len(sys.argv) > 1 else "4,6").split(",")]
    widths = [int(w) for w in (sys.argv[2] if len(sys.argv) > 2 else "1,2,4,8").split(",")]
    variants = (sys.argv[3] if len(sys.argv) > 3 else "neon,i8mm").split(",")
    if 1 not in widths:
        widths = [1, *widths]
    for tool in ("aarch64-linux-gnu-g++", "qemu-aarch64"):
        if shutil.which(tool) is None:
            sys.exit(f"arm_counts: {tool} not found (Debian: apt-get install {APT_PACKAGES})")
    with tempfile.TemporaryDirectory() as tmp:
        binaries = {v: build(v, Path(tmp)) for v in variants}
        jobs = [(v, k, w) for v in variants for k in kinds for w in widths]
        with ThreadPoolExecutor(os.cpu_count()) as pool:
            found = pool.map(lambda job: per_group(binaries[job[0]], job[1], job[2]), jobs)
            counts = dict(zip(jobs, found, strict=True))
    print("variant kind width  instructions/group  v compute-bound  v memory-bound (B = 2)")
    for v, k, w in jobs:
        one, this = counts[(v, k, 1)], counts[(v, k, w)]
        print(
            f"{v:7} q{k:<3} {w:5}  {this:18.1f}  {this / one:15.2f}  "
            f"{memory_bound(this, k) / memory_bound(one, k):22.2f}"
        )


if __name__ == "__main__":
    main()
