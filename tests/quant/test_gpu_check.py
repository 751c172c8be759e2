"""scripts/gpu_check.sh on a machine without CUDA: it says so, and its CPU-safe parts run."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


def gpu_check_module(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "gpu_check", module)  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(torch.cuda.is_available(), reason="with CUDA, run scripts/gpu_check.sh itself")
def test_without_cuda_it_says_so_and_runs_the_cpu_safe_checks(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHON": sys.executable, "TMPDIR": str(tmp_path)}
    result = subprocess.run(
        ["bash", "scripts/gpu_check.sh"], cwd=ROOT, capture_output=True, text=True, env=env, timeout=400
    )
    lines = result.stdout.splitlines()
    assert result.returncode == 0, result.stdout + result.stderr
    assert all(line.startswith("gpu_check: ") for line in lines), result.stdout
    assert lines[0].startswith("gpu_check: SKIP cuda: no CUDA device")
    # Every gpu test is listed, one line each, skipped for the stated reason.
    for check in (
        "verify_rows_equal_one_token_passes",
        "greedy_speculative_equals_plain",
        "sampled_distribution",
    ):
        for target in ("bf16", "4bit"):
            assert any(check in line and f"[{target}]" in line and "SKIP" in line for line in lines), check
    bench = [line for line in lines if "bench cpu" in line]
    assert (
        len(bench) == 1 and bench[0].startswith("gpu_check: PASS") and "greedy text = plain: all" in bench[0]
    )
    assert lines[-1] == "gpu_check: all checks passed"


def test_missing_requirements_are_named(monkeypatch: pytest.MonkeyPatch) -> None:
    module = gpu_check_module(monkeypatch)
    real_version = importlib.metadata.version

    def version(name: str) -> str:
        if name == "bitsandbytes":
            raise importlib.metadata.PackageNotFoundError(name)
        return "5.17.0" if name == "transformers" else real_version(name)

    monkeypatch.setattr(importlib.metadata, "version", version)
    missing = module.missing_requirements()
    assert any(m.startswith("bitsandbytes") and "not installed" in m for m in missing)
    assert any(m.startswith("transformers") and "found 5.17.0" in m for m in missing)
    assert len(missing) == 2
