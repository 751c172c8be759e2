"""scripts/gpu_probe.py on a CPU with tiny models: every section runs, so the probe cannot rot.

The same sections run on a GPU machine on 0.5/1.5/7B shapes (docs/performance.md, GPUs). Here the
run takes about 3 minutes on 2 cores (exact mode's section runs Triton's interpreter when
Triton is installed, and is skipped with its reason when it is not).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
SECTIONS = [
    "environment", "preflight", "costs-1.5b", "syncs", "speed-1.5b", "rows-1.5b", "costs-7b", "speed-7b",
    "rows-7b", "bnb-4bit", "stock-ops", "exact-1.5b", "compile-1.5b", "tiny-tests",
]  # fmt: skip


def probe_module(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_probe", ROOT / "scripts" / "gpu_probe.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "gpu_probe", module)  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_every_section_runs_on_a_cpu(tmp_path: Path) -> None:
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OUT": str(out)}
    result = subprocess.run(
        [sys.executable, "scripts/gpu_probe.py", "--device", "cpu", "--tiny", "--budget", "840"],
        cwd=ROOT, capture_output=True, text=True, env=env, timeout=900,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    records = [json.loads(line) for line in (out / "probe.jsonl").read_text().splitlines()]
    assert [r["section"] for r in records] == SECTIONS
    status = {r["section"]: r["status"] for r in records}
    assert all(s in ("ok", "skip") for s in status.values()), status
    for section in SECTIONS[:-4]:  # kernels, compile and tests may skip where Triton or CUDA is absent
        assert status[section] == "ok" or (section == "bnb-4bit" and status[section] == "skip"), status
    summary = (out / "summary.txt").read_text()
    assert "travels: tree" in summary and "MiB" in summary
    syncs = next(r for r in records if r["section"] == "syncs")
    assert syncs["graphs"]["per_round"] == 1.0  # the verdict's read, nothing else
    assert syncs["dynamic"]["per_round"] > 1.0
    speed = next(r for r in records if r["section"] == "speed-1.5b")
    assert all(run["greedy_equal"] for run in speed["runs"])
    assert {run["draft"] for run in speed["runs"]} == {"0.5b", "self"}
    if status["exact-1.5b"] == "ok":
        exact = next(r for r in records if r["section"] == "exact-1.5b")
        assert sum(w["rows_differ"] for w in exact["rows"]["widths"].values()) == 0
        assert all(run["alpha"] == 1.0 and run["greedy_equal"] for run in exact["speed"]["runs"])


def test_an_old_transformers_is_refused_in_one_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    module = probe_module(monkeypatch)
    real_version = module.importlib.metadata.version
    monkeypatch.setattr(
        module.importlib.metadata,
        "version",
        lambda name: "5.17.0" if name == "transformers" else real_version(name),
    )
    problems = module.gate_problems()
    assert len(problems) == 1 and "transformers 5.17.0 is older than" in problems[0]
    monkeypatch.setattr(module, "gate_problems", lambda: problems)
    assert module.main(["--device", "cpu", "--tiny", "--out", str(tmp_path)]) == 2
    record = json.loads((tmp_path / "probe.jsonl").read_text())
    assert record["section"] == "gate" and record["status"] == "fail"


def test_a_failing_section_is_recorded_and_the_rest_run(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    module = probe_module(monkeypatch)
    report = module.Report(tmp_path, deadline=module.time.monotonic() + 60)

    def broken() -> dict[str, object]:
        raise RuntimeError("boom")

    report.section("first", broken)
    report.section("second", lambda: {"summary": ["fine"]})
    report.section("third", lambda: {}, needs_s=3600)  # more than is left: skipped
    records = [json.loads(line) for line in (tmp_path / "probe.jsonl").read_text().splitlines()]
    assert [(r["section"], r["status"]) for r in records] == [
        ("first", "fail"),
        ("second", "ok"),
        ("third", "skip"),
    ]
    assert "boom" in records[0]["error"] and report.failed == 1


def test_the_size_line_counts_tree_and_wheels(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    module = probe_module(monkeypatch)
    wheels = tmp_path / ".whl"
    wheels.mkdir()
    (wheels / "a-1.0-py3-none-any.whl").write_bytes(b"x" * 2**20 * 3)
    monkeypatch.setattr(module, "WHEELS", wheels)
    monkeypatch.setattr(module, "travelling_files", lambda: [])
    assert module.size_line() == "travels: tree 0.0 MiB + .whl 3.0 MiB = 3.0 MiB (fits: the limit is 64 MiB)"
