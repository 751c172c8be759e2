"""Runs specchat commands on crafted files, each in a process of its own, cheaply.

    python tests/corpus/hostile_runner.py SPEC.json RESULTS.json

Starting python, torch, transformers and the kernels takes seconds; fifty starts would take
minutes. This runner pays that once: it imports everything a command imports, loads the kernels
(the sanitized build when the spec says so, see tests/kernels/sanitized.py), then forks one child
per case. A child is a fresh process as far as the case can tell: its own exit status, stdout and
stderr (files), environment, address-space limit (``RLIMIT_AS``: what the parent holds plus the
spec's ``memory`` bytes) and process group, killed after the spec's ``seconds``. The parent starts
no thread before forking, so each child starts clean.

SPEC: ``{"cases": [{"id", "args" or "call", "env"}], "memory", "seconds", "sanitized", "work"}``;
``call`` names ``module:function`` to run instead of the CLI. RESULTS: per case its id, exit
status (negative: the signal), seconds, peak resident memory (bytes), stdout, stderr, and
whether it was killed for time.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import json
import os
import resource
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def main() -> None:
    spec = json.loads(Path(sys.argv[1]).read_text())
    sys.path.insert(0, str(ROOT))
    _warm(bool(spec.get("sanitized")))
    results = [_run(index, case, spec) for index, case in enumerate(spec["cases"])]
    Path(sys.argv[2]).write_text(json.dumps(results))


def _warm(sanitized: bool) -> None:
    """Import what the commands import, and load the kernels, once for every child."""
    import torch  # noqa: F401
    import transformers  # noqa: F401
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig, PreTrainedTokenizerFast  # noqa: F401

    from specchat import kernels

    if sanitized:
        from tests.kernels.sanitized import load_sanitized

        kernels._loaded[kernels.choose_variant().name] = load_sanitized()
        # The runtime is loaded here and in every fork; a program the cases start (the chat
        # template's renderer, under its own memory limit) must not start it again.
        os.environ.pop("LD_PRELOAD", None)
    else:
        kernels.load()


def _address_space() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024
    return 0


def _run(index: int, case: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
    work = Path(spec["work"])
    out, err = work / f"{index}.out", work / f"{index}.err"
    limit = None if spec.get("sanitized") else _address_space() + int(spec["memory"])
    sys.stdout.flush()
    sys.stderr.flush()
    started = time.monotonic()
    pid = os.fork()
    if pid == 0:
        _child(case, out, err, limit)
    deadline = started + float(spec["seconds"])
    killed = False
    while True:
        done, status, usage = os.wait4(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            killed = True
            _kill_group(pid)
            done, status, usage = os.wait4(pid, 0)
            break
        time.sleep(0.02)
    seconds = time.monotonic() - started
    _kill_group(pid)  # whatever the case left running (a template renderer)
    print(f"{seconds:6.1f} s  {case['id']}", file=sys.stderr, flush=True)
    return {
        "id": case["id"],
        "status": os.waitstatus_to_exitcode(status),
        "seconds": seconds,
        "peak_bytes": usage.ru_maxrss * 1024,
        "killed": killed,
        "stdout": out.read_bytes().decode("utf-8", "backslashreplace"),
        "stderr": err.read_bytes().decode("utf-8", "backslashreplace"),
    }


def _kill_group(pid: int) -> None:
    with contextlib.suppress(OSError):
        os.killpg(pid, signal.SIGKILL)


def _child(case: dict[str, Any], out: Path, err: Path, limit: int | None) -> None:
    code = 1
    try:
        os.setpgid(0, 0)
        for fd, path in ((1, out), (2, err)):
            target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(target, fd)
            os.close(target)
        stdin = os.open(os.devnull, os.O_RDONLY)
        os.dup2(stdin, 0)
        os.environ.update(case.get("env", {}))
        if limit is not None:
            _soft, hard = resource.getrlimit(resource.RLIMIT_AS)
            resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
        code = _case(case)
    except BaseException:
        traceback.print_exc()
        code = 99
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
            atexit._run_exitfuncs()
        finally:
            os._exit(code)


def _case(case: dict[str, Any]) -> int:
    if "call" in case:
        module, function = case["call"].split(":")
        getattr(importlib.import_module(module), function)()
        return 0
    from specchat.cli import main as cli

    try:
        cli(args=case["args"], prog_name="specchat")
    except SystemExit as exit_:
        return exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
    return 0


if __name__ == "__main__":
    main()
