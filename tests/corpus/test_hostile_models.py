"""Hostile model files: every crafted file of tests/hostile_gguf.py through the real
``specchat generate`` and ``specchat models``.

Each case must end with one clear line naming what is wrong and exit status 2 (or run, for a file
that is valid apart from what specchat never reads), with no traceback, within 60 s and 2 GB, and
with no raw control byte in anything printed. All cases share one model cache, and a valid file
still runs in it afterwards. The cases run in one runner process that forks a fresh child for each
(tests/corpus/hostile_runner.py), so the whole corpus costs one start of python and the kernels.

The cases whose numbers used to reach the C++ decoder run again against the kernels built with
AddressSanitizer and UndefinedBehaviorSanitizer (tests/kernels/sanitized.py), together with the
decoder's own entry checks fed impossible sizes directly (tests/kernels/decoder_abuse.py): no
report may appear.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.hostile_gguf import CLASSES, LLAMA, OSC52_BEL, Case, cases

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the runner forks and reads /proc (Linux)")

RUNNER = Path(__file__).with_name("hostile_runner.py")
SECONDS = 60
MEMORY = 2 << 30
CASES = cases()
SIZE = sum(len(case.commands) for case in CASES) + 2
"""Runs in the corpus: every case through each of its commands, then the valid file and the listing."""
RAW = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200b-\u200f\u202a-\u202e\u2066-\u2069\ufeff]")
"""What must never reach the terminal raw: C0 but tab and newline, DEL, C1, bidi controls and
zero-width characters (spelled out here, not taken from the code under test)."""


@dataclass(frozen=True)
class Run:
    status: int
    seconds: float
    peak_bytes: int
    killed: bool
    stdout: str
    stderr: str


def _args(command: str, path: Path) -> list[str]:
    if command == "models":
        return ["models", str(path)]
    return ["generate", "hi", "--target", str(path), "--drafter", "none", "--max-new-tokens", "4"]


def _environment(folder: Path) -> dict[str, str]:
    return {
        "SPECCHAT_CACHE_DIR": str(folder / "cache"),
        "SPECCHAT_CONFIG": str(folder / "no-config.toml"),
        "SPECCHAT_DATA_DIR": str(folder / "data"),
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }


def run_cases(folder: Path, runs: list[dict[str, Any]], *, sanitized: bool = False) -> dict[str, Run]:
    """``runs`` through the runner; their results by id."""
    work = folder / ("work-sanitized" if sanitized else "work")
    work.mkdir(parents=True, exist_ok=True)
    spec = {"cases": runs, "memory": MEMORY, "seconds": SECONDS, "sanitized": sanitized, "work": str(work)}
    (work / "spec.json").write_text(json.dumps(spec))
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(RUNNER.parents[2]), os.environ.get("PYTHONPATH", "")]),
    }
    if sanitized:
        from tests.kernels.sanitized import sanitizer_environment

        env.update(sanitizer_environment() or {})
    done = subprocess.run(
        [sys.executable, str(RUNNER), str(work / "spec.json"), str(work / "results.json")],
        env=env,
        capture_output=True,
        text=True,
        timeout=60 * 60,
    )
    assert done.returncode == 0, done.stderr[-5000:]
    results = json.loads((work / "results.json").read_text())
    return {
        r["id"]: Run(r["status"], r["seconds"], r["peak_bytes"], r["killed"], r["stdout"], r["stderr"])
        for r in results
    }


def case_id(case: Case, command: str) -> str:
    return f"{command}: {case.name}"


@pytest.fixture(scope="session")
def hostile_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("hostile")
    for index, case in enumerate(CASES):
        sub = folder / "files" / f"case{index:02d}"
        sub.mkdir(parents=True)
        case.make(sub)
    return folder


def _crafted_path(folder: Path, case: Case) -> Path:
    sub = folder / "files" / f"case{CASES.index(case):02d}"
    return next(p for p in sorted(sub.iterdir(), key=lambda p: p.name) if not p.name.startswith("loop-b"))


@pytest.fixture(scope="session")
def hostile_runs(hostile_folder: Path) -> dict[str, Run]:
    """Every case through both commands, then a valid file and the listing, in one shared cache."""
    env = _environment(hostile_folder)
    runs = [
        {
            "id": case_id(case, command),
            "args": _args(command, _crafted_path(hostile_folder, case)),
            "env": env,
        }
        for case in CASES
        for command in case.commands
    ]
    valid = hostile_folder / "files" / "valid" / LLAMA.name
    valid.parent.mkdir(parents=True)
    shutil.copy(LLAMA, valid)
    runs.append({"id": "after: a valid file", "args": _args("generate", valid), "env": env})
    runs.append({"id": "after: the listing", "args": ["models"], "env": env})
    return run_cases(hostile_folder, runs)


def assert_clean(run: Run, what: str) -> None:
    """The limits every case keeps, refused or run."""
    assert not run.killed and run.seconds <= SECONDS, f"{what}: took {run.seconds:.0f} s"
    assert run.peak_bytes <= MEMORY, f"{what}: peaked at {run.peak_bytes / 1e9:.2f} GB"
    assert "Traceback" not in run.stderr and 'File "' not in run.stderr, f"{what}: {run.stderr}"
    shown = run.stdout + run.stderr
    raw = sorted({f"U+{ord(c):04X}" for c in RAW.findall(shown)})
    assert not raw, f"{what}: raw characters {raw} reached the terminal: {shown[:2000]!r}"


@pytest.mark.parametrize(
    ("case", "command"),
    [(case, command) for case in CASES for command in case.commands],
    ids=[case_id(case, command) for case in CASES for command in case.commands],
)
@pytest.mark.spawns
def test_a_crafted_file_gets_one_line_or_runs(case: Case, command: str, hostile_runs: dict[str, Run]) -> None:
    run = hostile_runs[case_id(case, command)]
    assert_clean(run, case_id(case, command))
    lines = [line for line in run.stderr.strip().splitlines() if line.strip()]
    if not case.refused:
        assert run.status == 0, run.stderr
        if command == "generate":
            assert run.stdout.strip(), "no text generated"
        return
    assert run.status == 2, f"exit {run.status}: {run.stderr}"
    last = lines[-1]
    assert last.startswith("specchat: "), last
    for word in case.words:
        assert word in last, f"{word!r} not in {last!r}"
    for line in lines[:-1]:  # only loading progress before the one line
        assert line.startswith("specchat: ") and "error" not in line, line


@pytest.mark.spawns
def test_a_valid_file_still_runs_in_the_same_cache(hostile_runs: dict[str, Run]) -> None:
    run = hostile_runs["after: a valid file"]
    assert_clean(run, "a valid file")
    assert run.status == 0 and run.stdout.strip(), run.stderr


@pytest.mark.spawns
def test_the_listing_shows_no_control_characters(hostile_runs: dict[str, Run]) -> None:
    """The cache holds the packed copy of a file named with OSC 52; listing it must not obey it."""
    run = hostile_runs["after: the listing"]
    assert_clean(run, "the listing")
    assert run.status == 0
    assert "evil" in run.stdout
    assert OSC52_BEL not in run.stdout


def test_every_class_of_the_issue_is_crafted() -> None:
    assert {case.klass for case in CASES} == set(CLASSES)
    assert len(CASES) >= 52


@pytest.fixture(scope="session")
def sanitized_runs(hostile_folder: Path) -> dict[str, Run]:
    """The decoder's entry checks fed impossible sizes, the cases that used to reach the decoder,
    and a valid file decoding, all on the kernels built with ASan and UBSan (a fresh cache)."""
    from tests.kernels.sanitized import sanitizer_environment

    if sanitizer_environment() is None:
        pytest.skip("gcc has no AddressSanitizer runtime here")
    env = _environment(hostile_folder / "sanitized")
    runs: list[dict[str, Any]] = [
        {"id": "entry checks", "call": "tests.kernels.decoder_abuse:run_all", "env": env}
    ]
    runs += [
        {
            "id": case_id(case, "generate"),
            "args": _args("generate", _crafted_path(hostile_folder, case)),
            "env": env,
        }
        for case in CASES
        if case.native
    ]
    runs.append({"id": "a valid file", "args": _args("generate", LLAMA), "env": env})
    return run_cases(hostile_folder, runs, sanitized=True)


@pytest.mark.spawns
@pytest.mark.native
def test_the_sanitized_kernels_report_nothing(sanitized_runs: dict[str, Run]) -> None:
    for what, run in sanitized_runs.items():
        report = run.stderr
        assert "AddressSanitizer" not in report and "runtime error:" not in report, f"{what}: {report}"
        assert not run.killed, what
        expected = 2 if what.startswith("generate: ") else 0
        assert run.status == expected, f"{what}: exit {run.status}: {report[-3000:]}"
