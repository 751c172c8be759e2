"""The checks behind scripts/gpu_check.sh: one summary line per check, tiny models only.

A GPU machine lent to this project reaches no network and receives at most 64 MiB of the tree,
so nothing here needs the packaged models or a hub: the tests build their own tiny seeded
models, and so does the bench below. Without CUDA every CUDA check reports SKIP and the bench
runs on the CPU, which checks this script itself (CI does that: tests/quant/test_gpu_check.py).

Exit status: 0 when nothing failed, 1 when a check failed, 2 when specchat's requirements are
not installed (the line says which).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
import tempfile
import time
import tomllib
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH_ARGS = [
    "--quick", "--per-category", "1", "--categories", "code,summarization,qa",
    "--max-new-tokens", "32", "--gammas", "1,3", "--hf-gammas", "2", "--seed", "0",
]  # fmt: skip
# Above the quick prompts' length in characters: the tiny models read one token per character.
TINY_CONTEXT = 4096
BUDGET_S = 290  # the whole run, promised to finish within 5 minutes


@dataclass
class Report:
    failed: int = 0
    deadline: float = field(default_factory=lambda: time.monotonic() + BUDGET_S)

    def time_left(self) -> float:
        return max(1.0, self.deadline - time.monotonic())

    def line(self, status: str, check: str, detail: str = "") -> None:
        if status == "FAIL":
            self.failed += 1
        print(f"gpu_check: {status:<4} {check}{': ' + detail if detail else ''}", flush=True)


def missing_requirements() -> list[str]:
    """Requirements of pyproject's base install and `gpu` extra that this Python does not satisfy."""
    from packaging.requirements import Requirement

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = [*project["dependencies"], *project["optional-dependencies"]["gpu"]]
    missing = []
    for text in wanted:
        requirement = Requirement(text)
        try:
            version = importlib.metadata.version(requirement.name)
        except importlib.metadata.PackageNotFoundError:
            missing.append(f"{requirement} (not installed)")
            continue
        if not requirement.specifier.contains(version, prereleases=True):
            missing.append(f"{requirement} (found {version})")
    return missing


def environment(report: Report) -> bool:
    """Say what runs where; False when CUDA is absent."""
    import torch

    versions = f"python {sys.version.split()[0]}, torch {torch.__version__}"
    if not torch.cuda.is_available():
        report.line("SKIP", "cuda", f"no CUDA device ({versions}): the CUDA checks are skipped")
        return False
    name = torch.cuda.get_device_name()
    report.line("PASS", "cuda", f"{name}, bf16 {torch.cuda.is_bf16_supported()}, {versions}")
    return True


def gpu_tests(report: Report, workdir: Path) -> None:
    """Every `gpu`-marked test, one line each (they skip themselves without CUDA)."""
    xml = workdir / "gpu-tests.xml"
    started = time.monotonic()
    command = [
        sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider",
        "--continue-on-collection-errors", f"--junitxml={xml}", "tests",
    ]  # fmt: skip
    result = run(report, command, workdir)
    if result is None:
        report.line("FAIL", "gpu tests", "out of time: the 5-minute budget ran out")
        return
    if not xml.exists():
        tail = (result.stdout + result.stderr).strip().splitlines()[-1:] or ["no output"]
        report.line("FAIL", "gpu tests", f"pytest did not run (exit {result.returncode}): {tail[0]}")
        return
    cases = ET.parse(xml).getroot().iter("testcase")
    for case in cases:
        name = f"{case.get('classname', '').rsplit('.', 1)[-1]}::{case.get('name')}"
        seconds = float(case.get("time", 0))
        problem = case.find("failure") if case.find("failure") is not None else case.find("error")
        skipped = case.find("skipped")
        if problem is not None:
            message = (problem.get("message") or "").splitlines()[0][:160]
            report.line("FAIL", name, f"{message} ({seconds:.1f} s)")
        elif skipped is not None:
            reason = (skipped.get("message") or "").removeprefix("Skipped: ")
            report.line("SKIP", name, reason)
        else:
            report.line("PASS", name, f"{seconds:.1f} s")
    if result.returncode not in (0, 5):  # 5: nothing selected
        errors = [x for x in result.stdout.splitlines() if x.startswith("ERROR")]
        for error in errors:
            report.line("FAIL", "gpu tests", error[:200])
    print(f"gpu_check: gpu tests took {time.monotonic() - started:.0f} s", flush=True)


def tiny_models(folder: Path) -> tuple[Path, Path]:
    """The tests' tiny seeded pair, with room for the bench's prompts."""
    from transformers.utils import logging as hf_logging

    from specchat.testing import TinyPair, make_model, make_tokenizer, perturbed_copy, save_tiny_pair

    hf_logging.disable_progress_bar()  # one line per check, no bars
    tokenizer = make_tokenizer()
    target = make_model(len(tokenizer), 0, max_positions=TINY_CONTEXT, logit_scale=3.0)
    return save_tiny_pair(TinyPair(target, perturbed_copy(target, 0.3, 1), tokenizer), folder)


def bench(report: Report, workdir: Path, device: str, quant: str | None) -> None:
    """A short `specchat bench` on the tiny pair; its timings wait for the device (synchronised)."""
    target, draft = tiny_models(workdir / "tiny")
    label = f"bench {device}" + (f" --quant {quant}" if quant else "")
    out = workdir / f"bench-{device}-{quant or 'none'}.json"
    command = [
        sys.executable, "-m", "specchat", "bench", "--target", str(target), "--draft", str(draft),
        "--device", device, *(["--quant", quant] if quant else []), *BENCH_ARGS, "--json", str(out),
    ]  # fmt: skip
    if device == "cpu":
        command += ["--threads", "1"]  # tiny models; CI's cores are shared
    started = time.monotonic()
    result = run(report, command, workdir)
    seconds = time.monotonic() - started
    if result is None:
        report.line("FAIL", label, "out of time: the 5-minute budget ran out")
        return
    if result.returncode != 0 or not out.exists():
        last = (result.stderr.strip().splitlines() or ["no output"])[-1]
        report.line("FAIL", label, f"exit {result.returncode}: {last[:200]}")
        return
    data = json.loads(out.read_text())
    summary, probe = data["summary"], data["costs"]["probe"]
    overall = [g for g in data["groups"] if g["category"] == "all"]
    unequal = [g["method"] for g in overall if g.get("greedy_equal") is False]
    status = "FAIL" if unequal else "PASS"
    detail = (
        f"plain {summary['plain_tok_s']:.0f} tok/s, best {summary['best']} {summary['best_tok_s']:.0f} tok/s "
        f"({summary['speedup_vs_plain']:.2f}x), target step {probe['target_ms']:.2f} ms, "
        f"draft step {probe['draft_ms']:.2f} ms, c={probe['c']:.2f}; greedy text = plain: "
        f"{'all' if not unequal else 'NOT ' + ', '.join(unequal)}; {data['meta']['dtype']}, "
        f"kernels {data['meta']['cpu_path']}; {seconds:.0f} s"
    )
    report.line(status, label, detail)


def run(report: Report, command: list[str], workdir: Path) -> subprocess.CompletedProcess[str] | None:
    """``command`` in the repository, within what is left of the budget (None when it ran out)."""
    try:
        return subprocess.run(
            command,
            cwd=ROOT,
            capture_output=True,
            text=True,
            env=child_env(workdir),
            timeout=report.time_left(),
        )
    except subprocess.TimeoutExpired:
        return None


def child_env(workdir: Path) -> dict[str, str]:
    """Private folders for config, caches and conversations, and no network."""
    env = dict(os.environ)
    env.update(
        SPECCHAT_CONFIG=str(workdir / "config.toml"),
        SPECCHAT_CACHE_DIR=str(workdir / "cache"),
        SPECCHAT_DATA_DIR=str(workdir / "data"),
        HF_HUB_OFFLINE="1",
        PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])),
    )
    return env


def main() -> int:
    report = Report()
    missing = missing_requirements()
    if missing:
        report.line("FAIL", "requirements", "; ".join(missing))
        print("gpu_check: install them (offline: carry wheels, see README's GPU section)", flush=True)
        return 2
    sys.path.insert(0, str(ROOT))
    has_cuda = environment(report)
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        workdir = Path(tmp)
        gpu_tests(report, workdir)
        if has_cuda:
            bench(report, workdir, "cuda", None)
            bench(report, workdir, "cuda", "4bit")
        else:  # the same bench on the CPU: proves the script and the bench work on tiny models
            bench(report, workdir, "cpu", None)
    verdict = "all checks passed" if not report.failed else f"{report.failed} check(s) FAILED"
    print(f"gpu_check: {verdict}", flush=True)
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(main())
