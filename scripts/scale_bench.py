"""A big GGUF's first start, warm start, peak memory, plain decoding speed and verify-pass cost
v(γ) on specchat's CPU kernels, beside llama.cpp's decoding of the same file. Out of CI (sizes).

    python scripts/make_shaped_gguf.py 7b /tmp/q7b.gguf
    flock /tmp/specchat-bench.lock python scripts/scale_bench.py /tmp/q7b.gguf \\
        --llama-bench /path/to/llama-bench --cache /tmp/scale-cache

- first start: ``specchat generate --drafter none`` (64 tokens) in an empty packed cache, the
  kernels already built (their build is timed apart); wall time and peak resident memory
  (``/usr/bin/time -v``);
- warm start: the same command again;
- plain speed: the warm run's tokens per second;
- v(γ): the time of one pass over γ new tokens over that of one token, at the same position,
  taking turns (the verify pass's cost in target steps; speculation pays when it is near 1);
- llama.cpp: ``llama-bench -p 0 -n 64`` on the same file and threads.

The packed copy goes in ``--cache`` (it takes the file's size again); ``--keep`` leaves it there.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

PROMPT = "Write a haiku about the sea."

V_GAMMA = r"""
import statistics, sys, time, torch
from pathlib import Path
from specchat.models.compute.packed_cache import load_packed
torch.set_num_threads(int(sys.argv[2]))
model, _ = load_packed(Path(sys.argv[1]), "scale")
widths = [int(w) for w in sys.argv[3].split(",")]
cache = model.new_cache()
model(torch.arange(32)[None], cache=cache)
times = {w: [] for w in widths}
for step in range(int(sys.argv[4]) + 1):  # the first round warms up (page faults, caches)
    for w in widths:
        started = time.perf_counter()
        model(torch.arange(w)[None] + 100, cache=cache, logits_to_keep=w)
        if step:
            times[w].append(time.perf_counter() - started)
        cache.length = 32
medians = {w: statistics.median(t) for w, t in times.items()}
print(" ".join(f"{w}:{medians[w] / medians[1]:.3f}" for w in widths), f"step_ms:{medians[1] * 1e3:.1f}")
"""


def timed(command: list[str], env: dict[str, str]) -> tuple[float, int, str]:
    """(wall seconds, peak resident bytes, stdout) of ``command`` under /usr/bin/time -v."""
    done = subprocess.run(
        ["/usr/bin/time", "-v", *command], env=env, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        sys.exit(f"{' '.join(command)} failed:\n{done.stderr[-2000:]}")
    peak = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", done.stderr).group(1)) * 1024  # type: ignore[union-attr]
    clock = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): ([\d:.]+)", done.stderr).group(1)  # type: ignore[union-attr]
    seconds = sum(float(part) * 60**i for i, part in enumerate(reversed(clock.split(":"))))
    return seconds, peak, done.stdout


def tokens_per_second(jsonl: str) -> float:
    summary = [json.loads(line) for line in jsonl.splitlines() if '"summary"' in line][-1]
    return float(summary["tokens_per_s"])


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("gguf", type=Path)
    parser.add_argument("--cache", type=Path, default=Path("scale-cache"), help="an empty cache to start in")
    parser.add_argument("--llama-bench", type=Path, help="llama.cpp's llama-bench, to compare")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--widths", default="1,2,4,8", help="the γ of v(γ)")
    parser.add_argument("--steps", type=int, default=8, help="passes per width for v(γ)")
    parser.add_argument("--keep", action="store_true", help="keep the packed copy")
    args = parser.parse_args()
    env = {**os.environ, "SPECCHAT_CACHE_DIR": str(args.cache), "OMP_NUM_THREADS": str(args.threads)}
    python = sys.executable
    shutil.rmtree(args.cache / "packed", ignore_errors=True)
    started = time.monotonic()
    subprocess.run([python, "-c", "from specchat.kernels import load; load()"], env=env, check=True)
    build = time.monotonic() - started
    generate = [python, "-m", "specchat", "generate", "--target", str(args.gguf), "--drafter", "none"]
    generate += ["--max-new-tokens", "64", "--temperature", "0", "--format", "jsonl", PROMPT]
    first, first_peak, _ = timed(generate, env)
    warm, warm_peak, out = timed(generate, env)
    speed = tokens_per_second(out)
    [folder] = [f for f in (args.cache / "packed").iterdir() if not f.name.startswith(".")]
    packed = sum(f.stat().st_size for f in folder.iterdir())
    v = subprocess.run(
        [python, "-c", V_GAMMA, str(folder), str(args.threads), args.widths, str(args.steps)],
        env=env, capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    size = args.gguf.stat().st_size
    print(f"file {args.gguf.name}: {size / 1e9:.2f} GB, packed {packed / 1e9:.2f} GB, {args.threads} threads")
    print(f"kernels build (already built: a load): {build:.1f} s")
    print(
        f"first start + 64 tokens: {first:.1f} s, peak {first_peak / 1e9:.2f} GB "
        f"({first_peak / size:.2f}x the file)"
    )
    print(f"warm start + 64 tokens: {warm:.1f} s, peak {warm_peak / 1e9:.2f} GB")
    print(f"plain decoding: {speed:.2f} tok/s")
    print(f"v(gamma) (pass of gamma tokens / one token): {v}")
    if args.llama_bench:
        bench = subprocess.run(
            [str(args.llama_bench), "-m", str(args.gguf), "-p", "0", "-n", "64", "-t", str(args.threads),
             "-o", "json"],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        theirs = float(json.loads(bench)[0]["avg_ts"])
        print(f"llama.cpp plain decoding: {theirs:.2f} tok/s; specchat / llama.cpp = {speed / theirs:.2f}")
    if not args.keep:
        shutil.rmtree(folder)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
