"""Hostile servers: every case of tests/corpus/server_cases.py through the real
``specchat generate --server``, each in a fresh process limited to 2 GB of address space more
than the runner holds and killed after 60 s (tests/corpus/hostile_runner.py), against a
misbehaving server on 127.0.0.1 in this process (tests/corpus/hostile_server.py).

Each case ends with one line and exit status 2, or with the reply and a note (status 0) where
the reply is still what was asked for; no traceback; what arrived is printed; and nothing printed
holds a raw control, bidi or zero-width character.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.corpus.hostile_server import HostileServer
from tests.corpus.server_cases import CASES, CLASSES, FIFO_CASES, ServerCase, payload_of_jsonl
from tests.corpus.test_hostile_models import Run, assert_clean, run_cases

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the runner forks and reads /proc (Linux)")


def _environment(folder: Path, case_env: dict[str, str]) -> dict[str, str]:
    env = {
        "SPECCHAT_CACHE_DIR": str(folder / "cache"),
        "SPECCHAT_CONFIG": str(folder / "no-config.toml"),
        "SPECCHAT_DATA_DIR": str(folder / "data"),
        "SPECCHAT_API_KEY": "",
        "HF_HUB_OFFLINE": "1",
    }
    return {**env, **case_env}


def _name(index: int) -> str:
    return f"c{index:02d}"


@pytest.fixture(scope="module")
def server_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Run]:
    folder = tmp_path_factory.mktemp("hostile-servers")
    runs: list[dict[str, Any]] = []
    with HostileServer() as server:
        for index, case in enumerate(CASES):
            server.routes[_name(index)] = case.routes
            args = [
                "generate",
                "hi",
                "--server",
                server.url(_name(index)),
                "--max-new-tokens",
                "8",
                *case.args,
            ]
            runs.append({"id": case.name, "args": args, "env": _environment(folder, case.env)})
        for index, (name, (command, flag)) in enumerate(FIFO_CASES.items()):
            fifo = folder / f"fifo{index}"
            os.mkfifo(fifo)
            args = [command, flag, str(fifo), "--server", server.url("none")]
            runs.append({"id": name, "args": args, "env": _environment(folder, {})})
        return run_cases(folder, runs)


def _last_line(run: Run) -> str:
    lines = [line for line in run.stderr.strip().splitlines() if line.strip()]
    assert lines, "no message at all"
    return lines[-1]


@pytest.mark.spawns
@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_a_hostile_server_gets_one_line_or_a_note(case: ServerCase, server_runs: dict[str, Run]) -> None:
    run = server_runs[case.name]
    assert_clean(run, case.name)
    assert run.status == case.status, f"exit {run.status}: {run.stderr[-3000:]}"
    if case.status == 2:
        last = _last_line(run)
        assert last.startswith("specchat: "), last
        for word in case.words:
            assert word in last, f"{word!r} not in {last!r}"
    else:
        for word in case.words:
            assert word in run.stderr, f"{word!r} not in {run.stderr!r}"
    if case.printed is not None:
        assert run.stdout.startswith(case.printed), run.stdout[:500]
    for text in case.absent:
        assert text not in run.stdout + run.stderr, f"{text!r} was printed"
    if "--format" in case.args and "jsonl" in case.args:
        assert payload_of_jsonl(run.stdout) == "\u202eevil"  # exact, though escaped on the line


@pytest.mark.spawns
@pytest.mark.parametrize("name", list(FIFO_CASES))
def test_a_fifo_with_no_writer_is_refused_after_its_wait(name: str, server_runs: dict[str, Run]) -> None:
    run = server_runs[name]
    assert_clean(run, name)
    assert run.status == 2, run.stderr
    last = _last_line(run)
    assert "a pipe (FIFO) that sent nothing for 10 s" in last, last


def test_every_class_of_the_issue_is_in_the_corpus() -> None:
    seen = {case.klass for case in CASES} | {"fifo"}
    assert seen == set(CLASSES)
    assert len(CASES) + len(FIFO_CASES) >= 30


def test_the_corpus_counts_by_class() -> None:
    """The count the closing note gives (and docs/what-happens-when.md)."""
    counts = {klass: sum(case.klass == klass for case in CASES) for klass in CLASSES}
    counts["fifo"] = len(FIFO_CASES)
    assert all(counts.values()), counts
    print(json.dumps(counts))
