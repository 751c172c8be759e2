"""Interleaved A/B runs of `specchat generate`: tokens/s from each run's own JSON summary.

    python scripts/lab/ab_generate.py REPS NAME=BIN:FLAGS [NAME=BIN:FLAGS ...]

BIN is the folder holding the `specchat` to run (a virtual environment's bin/, so two checkouts
can be compared), FLAGS the extra `generate` flags, split on spaces. Every configuration runs
REPS times, in ABC order then CBA, so that a machine slowing down or speeding up during the
series weighs on all of them alike. The lab notebook's lever tables (docs/lab/) were made with it.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from dataclasses import dataclass, field

PROMPT = "Write a Python function that checks whether a number is prime."


@dataclass
class Config:
    name: str
    bindir: str
    flags: list[str]
    rates: list[float] = field(default_factory=list)


def parse(spec: str) -> Config:
    name, _, rest = spec.partition("=")
    bindir, _, flags = rest.partition(":")
    if not name or not bindir:
        raise SystemExit(f"expected NAME=BIN:FLAGS, got {spec!r}")
    return Config(name, bindir, flags.split())


def summary_of(config: Config) -> dict[str, object]:
    command = [
        f"{config.bindir}/specchat", "generate", PROMPT, "--temperature", "0",
        "--max-new-tokens", "128", "--format", "jsonl", *config.flags,
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed: {done.stderr[-2000:]}")
    events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    return next(e for e in events if e["type"] == "summary")


def main(argv: list[str]) -> None:
    if len(argv) < 2:
        raise SystemExit(__doc__)
    reps, configs = int(argv[0]), [parse(spec) for spec in argv[1:]]
    print(f"load before: {os.getloadavg()}", flush=True)
    for rep in range(reps):
        for config in configs if rep % 2 == 0 else reversed(configs):
            summary = summary_of(config)
            rate = float(summary["tokens_per_s"])  # type: ignore[arg-type]
            config.rates.append(rate)
            print(
                f"rep {rep} {config.name:<24} {rate:7.2f} tok/s  tokens={summary['tokens']} "
                f"alpha={summary.get('alpha')} tau={summary.get('tau')}",
                flush=True,
            )
    print(f"load after: {os.getloadavg()}")
    for config in configs:
        rates = [round(r, 2) for r in config.rates]
        print(f"{config.name:<24} median {statistics.median(config.rates):7.2f}  all {rates}")


if __name__ == "__main__":
    main(sys.argv[1:])
