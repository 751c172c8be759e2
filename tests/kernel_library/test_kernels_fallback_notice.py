"""What the loader says when specchat's kernels are damaged or cannot load.

``auto`` never falls back to fbgemm's int8 path unasked (an 11 GB fp32 copy, a 14 GB peak): where
the kernels cannot load the start stops with one line naming the way out. A rebuild is a notice
(kept on screen by `generate` and as a toast by the TUI), not a progress step that the next step
overwrites.
"""

from __future__ import annotations

import pytest

import specchat.kernels as kernels
from specchat.errors import InvalidSettingError
from specchat.kernels import KernelsUnavailable
from specchat.kernels.library import Report
from specchat.models.compute.cpu_quant import FALLBACK_CPU_PATH, NATIVE_CPU_PATH
from specchat.models.loading.loader import choose_cpu_path
from specchat.models.records import LoadProgress

REASON = "/cache/kernels/specchat_qgemm.so is damaged (9,000 bytes where 2,500,000 were built)"


@pytest.fixture(autouse=True)
def kernels_expected_here(monkeypatch: pytest.MonkeyPatch) -> None:
    """A fast variant runs and is built, whatever this CPU has."""
    monkeypatch.delenv(kernels.ISA_ENV, raising=False)
    monkeypatch.setattr(kernels, "slow_reason", lambda: None)
    monkeypatch.setattr(kernels, "is_built", lambda: True)


@pytest.mark.parametrize("cpu_path", ["auto", NATIVE_CPU_PATH])
def test_kernels_that_cannot_load_stop_the_start_in_one_line_with_the_way_out(
    monkeypatch: pytest.MonkeyPatch, cpu_path: str
) -> None:
    def unavailable(report: Report | None = None) -> None:
        raise KernelsUnavailable(REASON)

    monkeypatch.setattr(kernels, "load", unavailable)
    with pytest.raises(InvalidSettingError) as stopped:
        choose_cpu_path(cpu_path, "cpu", None, None)
    line = str(stopped.value)
    assert "\n" not in line and REASON in line and f"--cpu-path {FALLBACK_CPU_PATH}" in line


def test_the_int8_path_still_runs_when_asked_for_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    def must_not_load(report: Report | None = None) -> None:
        raise AssertionError("the int8 path needs no kernels")

    monkeypatch.setattr(kernels, "load", must_not_load)
    assert str(choose_cpu_path(FALLBACK_CPU_PATH, "cpu", None, None)) == FALLBACK_CPU_PATH


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
