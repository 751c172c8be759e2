"""What the loader says when specchat's kernels are damaged or cannot load (issue 22, item 10).

A fallback to the int8 path makes starts and replies several times slower, so its reason is a
notice (kept on screen by `generate` and as a toast by the TUI), not a progress step that the
next step overwrites.
"""

from __future__ import annotations

import pytest

import specchat.kernels as kernels
import specchat.models.cpu_quant as cpu_quant
from specchat.kernels import KernelsUnavailable
from specchat.kernels.library import Report
from specchat.models.cpu_quant import FALLBACK_CPU_PATH, NATIVE_CPU_PATH
from specchat.models.loader import choose_cpu_path
from specchat.models.records import LoadProgress

REASON = "/cache/kernels/specchat_qgemm.so is damaged (9,000 bytes where 2,500,000 were built)"


@pytest.fixture(autouse=True)
def kernels_expected_here(monkeypatch: pytest.MonkeyPatch) -> None:
    """`auto` picks the native path, as on a CPU with AVX-512 VNNI (whatever this one has)."""
    monkeypatch.setattr(cpu_quant, "auto_cpu_path", lambda: NATIVE_CPU_PATH)
    monkeypatch.setattr(kernels, "is_built", lambda: True)


def test_a_fallback_to_int8_is_a_notice_with_its_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    def unavailable(report: Report | None = None) -> None:
        raise KernelsUnavailable(REASON)

    monkeypatch.setattr(kernels, "load", unavailable)
    events: list[LoadProgress] = []
    chosen = choose_cpu_path("auto", "cpu", None, events.append)
    assert str(chosen) == FALLBACK_CPU_PATH
    [line] = [event.message for event in events if event.stage == "notice"]
    assert REASON in line and FALLBACK_CPU_PATH in line


def test_a_rebuild_the_kernels_announce_reaches_the_user_as_a_notice(monkeypatch: pytest.MonkeyPatch) -> None:
    said = "specchat's CPU kernels in /cache/kernels/specchat_qgemm.so are damaged: rebuilding them"

    def rebuilding(report: Report | None = None) -> None:
        assert report is not None, "the loader gives the kernels somewhere to say what they do"
        report(said)

    monkeypatch.setattr(kernels, "load", rebuilding)
    events: list[LoadProgress] = []
    chosen = choose_cpu_path("auto", "cpu", None, events.append)
    assert str(chosen) == NATIVE_CPU_PATH
    assert [event.message for event in events if event.stage == "notice"] == [said]
